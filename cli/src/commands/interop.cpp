// `remat-report export` and `import`: a dump to PyTorch's memory-snapshot pickle, and a pickle into
// a remat snapshot dump (interop/torch_snapshot.hpp does the conversion). A snapshot in a file is
// exported as it streams by (renderers/streamed_snapshot.hpp).

#include "commands/command.hpp"
#include "core/errors.hpp"
#include "interop/torch_export.hpp"
#include "interop/torch_snapshot.hpp"
#include "output/output_file.hpp"
#include "reader/dump_reader.hpp"
#include "reader/input_file.hpp"
#include "reader/input_sniff.hpp"
#include "renderers/document.hpp"
#include "renderers/streamed_snapshot.hpp"

#include <fmt/format.h>

#include <memory>
#include <optional>

namespace remat::report {

namespace {
struct ExportOptions {
  std::string file;
  std::string to;
  std::string out;
};
struct ImportOptions {
  std::string file;
  std::string out;
  std::int64_t device = -1;
};

// What `export` reports of what it wrote.
struct Exported {
  std::uint64_t segments = 0, blocks = 0, events = 0, device = 0;
};

// A snapshot's pickle written to the output as the snapshot streams by: the pickle's segments as
// its segments go by, then its trace. That needs the header and the tag table before the segments
// and the segments before the trace, the order the allocator writes them; a snapshot in another
// order is refused here (an InputError: open_streaming reads it whole). A failed write is told once
// the snapshot has passed every check (OutputFileWriter), as a whole read tells it.
class StreamedExport final : public EventSink {
 public:
  explicit StreamedExport(const OutputTarget& target) : target_(target) {}

  StreamHooks hooks() {
    StreamHooks hooks;
    hooks.on_array = [this](StreamedArray array, const DumpFile& so_far) {
      if (array != StreamedArray::segments) return;
      header_ = read_document(so_far, [](json::object root) { return read_dump_header(root, JsonPath()); });
      tags_ = read_document(so_far, [](json::object root) { return read_tag_table(root, JsonPath()); });
      writer_.emplace(*tags_, header_->device);
      out_.emplace(target_);
    };
    return hooks;
  }
  void on_segment(const Segment& segment) {
    if (!writer_) throw InputError("the snapshot's segments come before its tag table: read it whole");
    writer_->segment(segment);
    ++exported_.segments;
    exported_.blocks += segment.blocks.size();
    out_->write(writer_->take());
  }
  EventSink& events(const TagTable&) {
    if (!writer_) throw InputError("the snapshot's trace comes before its segments: read it whole");
    return *this;
  }
  void on_event(const Event& event) override {
    writer_->event(event);
    if (++exported_.events % kEventsAWrite == 0) out_->write(writer_->take());
  }
  // The pickle's end, once `snapshot` (its segments and events gone by) has passed every check.
  Exported finish(const Snapshot& snapshot) {
    out_->write(writer_->finish(snapshot.header.producer));
    out_->commit();
    exported_.device = header_->device;
    return exported_;
  }

 private:
  static constexpr std::uint64_t kEventsAWrite = 8192;  // about 1 MiB of pickle
  OutputTarget target_;
  std::optional<DumpHeader> header_;
  std::optional<TagTable> tags_;
  std::optional<TorchSnapshotWriter> writer_;
  std::optional<OutputFileWriter> out_;
  Exported exported_;
};

// Exports the dump `file` names: a snapshot in a file as it streams by, anything else read whole.
Exported export_torch_snapshot(const std::string& file, const OutputTarget& target) {
  auto streamed = std::make_unique<StreamedExport>(target);
  const SnapshotInput input = open_streaming(
      file, [&](const TagTable& tags) -> EventSink& { return streamed->events(tags); },
      [&](const Segment& segment) { streamed->on_segment(segment); }, streamed->hooks());
  if (input.streamed) return streamed->finish(*input.streamed);
  streamed.reset();  // its temporary file, if it streamed part of the way
  const DumpFile& dump = input.file;
  const AllocatorState state = renderer_for(dump, {"export", View::allocator_state, {}}).allocator_state(dump);
  write_output_file(target, torch_snapshot_pickle(state));
  Exported exported{state.segments.size(), 0, state.events.size(), state.header.device};
  for (const Segment& segment : state.segments) exported.blocks += segment.blocks.size();
  return exported;
}

}  // namespace

void register_export(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("export", "Convert a dump for other tools (PyTorch's memory viewer)");
  auto opts = std::make_shared<ExportOptions>();
  command->add_option("file", opts->file, "A remat dump (snapshot, trace)")->required();
  command->add_option("--to", opts->to, "Target format")->required()->check(CLI::IsMember({"torch-snapshot"}));
  command->add_option("-o,--output", opts->out, "OUT.pickle")->required();
  add_output_options(*command, options);
  command->callback([opts, &options] {
    const OutputTarget target = output_target(opts->out, {opts->file});
    const Exported exported = export_torch_snapshot(opts->file, target);
    Report report;
    Table table = key_value_table("export", "Exported a PyTorch memory snapshot");
    add_field(table, "output", Cell::text(opts->out));
    add_field(table, "segments", Cell::count(exported.segments));
    add_field(table, "blocks", Cell::count(exported.blocks));
    add_field(table, "trace_events", Cell::count(exported.events));
    add_field(table, "device", Cell::count(exported.device));
    report.tables.push_back(std::move(table));
    report.notes.push_back("open it at https://pytorch.org/memory_viz or run `python -m torch.cuda._memory_viz stats " +
                           opts->out + "`");
    print(report, options);
  });
}

void register_import(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("import", "Read a PyTorch memory snapshot pickle into a remat snapshot dump");
  auto opts = std::make_shared<ImportOptions>();
  command->add_option("file", opts->file, "A pickle written by torch.cuda.memory._dump_snapshot")->required();
  command->add_option("-o,--output", opts->out, "OUT.json")->required();
  command->add_option("--device", opts->device, "Device to import (default: the first with memory)")
      ->check(whole_number(0, INT32_MAX, "a CUDA device index"));
  add_output_options(*command, options);
  command->callback([opts, &options] {
    const OutputTarget target = output_target(opts->out, {opts->file});
    const std::string bytes = read_whole_input(opts->file, refuse_non_pickle_start);
    const std::string name = opts->file == kStdinArgument ? std::string(kStdinName) : opts->file;
    ImportResult result;
    try {
      result = import_torch_snapshot(bytes, opts->device, name);
    } catch (const InputError& error) {
      throw InputError(name, error.what());
    }
    write_output_file(target, result.text);
    Report report;
    Table table = key_value_table("import", "Imported a PyTorch memory snapshot");
    add_field(table, "output", Cell::text(opts->out));
    add_field(table, "device", Cell::count(result.device));
    add_field(table, "segments", Cell::count(result.segments));
    add_field(table, "blocks", Cell::count(result.blocks));
    add_field(table, "trace_events", Cell::count(result.events));
    add_field(table, "skipped_events", Cell::count(result.skipped_events));
    add_field(table, "tags", Cell::count(result.snapshot["tags"].size()));
    report.tables.push_back(std::move(table));
    print(report, options);
  });
}

}  // namespace remat::report
