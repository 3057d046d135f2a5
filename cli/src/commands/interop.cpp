// `remat-report export` and `import`: a dump to PyTorch's memory-snapshot pickle, and a pickle into
// a remat snapshot dump (interop/torch_snapshot.hpp does the conversion).

#include "commands/command.hpp"
#include "core/errors.hpp"
#include "interop/torch_snapshot.hpp"
#include "output/output_file.hpp"
#include "reader/input_file.hpp"
#include "reader/input_sniff.hpp"

#include <fmt/format.h>

#include <memory>

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
    const DumpFile dump = open_dump(opts->file);
    const AllocatorState state = renderer_for(dump, {"export", View::allocator_state, {}}).allocator_state(dump);
    write_output_file(target, torch_snapshot_pickle(state));
    std::size_t blocks = 0;
    for (const Segment& segment : state.segments) blocks += segment.blocks.size();
    Report report;
    Table table = key_value_table("export", "Exported a PyTorch memory snapshot");
    add_field(table, "output", Cell::text(opts->out));
    add_field(table, "segments", Cell::count(state.segments.size()));
    add_field(table, "blocks", Cell::count(blocks));
    add_field(table, "trace_events", Cell::count(state.events.size()));
    add_field(table, "device", Cell::count(state.header.device));
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
