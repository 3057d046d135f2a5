// `remat-report whatif`: replays a recorded trace through the project's caching pool on a
// virtual device under the recorded settings and under others, side by side in one pass
// (analysis/whatif_replay.hpp), and prints what each would have reserved, or where it fails.

#include "analysis/whatif_replay.hpp"
#include "commands/command.hpp"
#include "core/byte_size.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"
#include "core/terminal_text.hpp"
#include "interop/torch_snapshot.hpp"
#include "reader/dump_file.hpp"
#include "reader/dump_reader.hpp"
#include "reader/input_file.hpp"
#include "reader/input_sniff.hpp"
#include "reader/trace_file.hpp"
#include "renderers/document.hpp"
#include "renderers/renderer.hpp"
#include "renderers/streamed_snapshot.hpp"
#include "renderers/whatif_report.hpp"

#include <remat/alloc/config.hpp>
#include <remat/alloc/dump.hpp>
#include <remat/alloc/errors.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

namespace remat::report {

namespace {

constexpr std::uint64_t kDefaultCapacity = std::uint64_t{1} << 50;  // 1 PiB: nothing fails
constexpr std::uint64_t kLargestCapacity = std::uint64_t{1} << 52;  // 4 PiB
constexpr std::size_t kFirstChunk = std::size_t{1} << 16;

struct WhatIfOptions {
  std::string file;
  std::vector<std::string> confs;
  std::string capacity;
  std::int64_t device = -1;
};

std::uint64_t parse_capacity(const std::string& text) {
  static const SizeRules rules{.bare_bytes = true, .zero_refused = "zero bytes: give the device's memory"};
  const std::uint64_t bytes = parse_byte_size("--capacity", text, rules);
  if (bytes > kLargestCapacity) {
    throw UsageError(fmt::format("--capacity {}: more than 4 PiB, the most a replayed device may have (each "
                                 "expandable segment reserves the device's size and an eighth more of the 64-bit "
                                 "address space); give the device's memory, such as 80GB or 80GiB",
                                 printable(text)));
  }
  return bytes;
}

// Keys of REMAT_ALLOC_CONF a replay of the caching pool has no use for: each given in --conf is
// noted (host_capacity_mb is the device memory, which --capacity sets).
void note_settings_not_replayed(const std::string& text, std::vector<std::string>& notes) {
  std::size_t at = 0;
  while (at <= text.size()) {
    std::size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    std::string_view key = std::string_view(text).substr(at, end - at);
    key = key.substr(0, key.find(':'));
    key.remove_prefix(std::min(key.size(), key.find_first_not_of(" \t")));
    key = key.substr(0, key.find_last_not_of(" \t") + 1);
    if (key == "host_capacity_mb") {
      notes.push_back(fmt::format("--conf {}: host_capacity_mb is not replayed; give the device memory as --capacity",
                                  printable(text)));
    } else if (key == "backend" || key == "trace_entries" || key == "oom_dump_dir" || key == "oom_dump_interval_ms" ||
               key == "tagging") {
      notes.push_back(
          fmt::format("--conf {}: {} sets no caching-pool behaviour and is not replayed", printable(text), key));
    }
    at = end + 1;
  }
}

// --conf text in REMAT_ALLOC_CONF's form, or else a job's PYTORCH_CUDA_ALLOC_CONF text as it
// stands (backend:native, pinned_* and the other keys only PyTorch's allocator has are noted in
// `notes`, when given, and not replayed). A text that is neither is REMAT_ALLOC_CONF's error.
alloc::Config parse_conf(const std::string& text, const alloc::Config& base, std::vector<std::string>* notes) {
  if (text.find_first_not_of(", \t") == std::string::npos) {
    throw UsageError(fmt::format("--conf {}: no setting in it; give key:value pairs separated by commas, such as "
                                 "expandable_segments:True or max_split_size_mb:128,memory_fraction:0.9",
                                 text.empty() ? std::string("'' (empty)") : printable(text)));
  }
  try {
    alloc::Config config = alloc::Config::parse(text, base, "--conf");
    if (notes != nullptr) note_settings_not_replayed(text, *notes);
    return config;
  } catch (const alloc::ConfigError& error) {
    std::vector<std::string> not_applied;
    alloc::Config config;
    try {
      config = alloc::Config::parse_pytorch(text, base, not_applied, "--conf");
    } catch (const alloc::ConfigError&) {
      throw UsageError(error.what());
    }
    if (notes == nullptr) return config;
    for (const std::string& item : not_applied) {
      notes->push_back(fmt::format("--conf {}: the PyTorch setting {} has no meaning for this pool and is not replayed",
                                   printable(text), escape_controls(item)));
    }
    return config;
  }
}

// The recorded configuration from the text a snapshot or pickle holds; notes why not when it
// does not parse.
void recorded_config(RecordedInput& recorded, const std::string& text, bool pytorch, const std::string& source) {
  try {
    if (pytorch) {
      std::vector<std::string> not_applied;
      recorded.config = alloc::Config::parse_pytorch(text, alloc::Config{}, not_applied, source);
      for (const std::string& item : not_applied) {
        recorded.notes.push_back(fmt::format("the recorded setting {} has no meaning for this pool and is not replayed",
                                             escape_controls(item)));
      }
    } else {
      recorded.config = alloc::Config::parse(text, alloc::Config{}, source);
    }
    recorded.config_source = source;
  } catch (const alloc::ConfigError& error) {
    recorded.config_source = "defaults (the recorded settings do not parse)";
    recorded.notes.push_back(fmt::format("{}; the first run uses the default settings", error.what()));
  }
}

void no_recorded_config(RecordedInput& recorded, std::string_view why) {
  recorded.config_source = "defaults (none recorded)";
  recorded.notes.push_back(fmt::format("{}: the first run uses the default settings; pass --conf with the job's "
                                       "REMAT_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF text to compare against it",
                                       why));
}

// What a remat snapshot records for the runs: its device and memory, its settings (none where
// `import` made it from a pickle), and the records its ring dropped.
void record_snapshot(RecordedInput& recorded, const std::string& kind, const Snapshot& snapshot) {
  recorded.kind = kind;
  recorded.device = snapshot.header.device;
  recorded.device_total = snapshot.device_total_bytes;
  if (snapshot.header.producer == kImportProducer) {
    no_recorded_config(recorded,
                       "the snapshot was imported from a PyTorch pickle, whose allocator settings it does "
                       "not keep (run whatif on the pickle itself to use them)");
  } else {
    recorded_config(recorded, snapshot.config.text, false, "the snapshot's config.text");
    recorded.followable = true;
  }
  if (snapshot.trace_dropped > 0) {
    recorded.notes.push_back(
        fmt::format("the snapshot's trace ring had dropped {} records: blocks allocated before its first event are "
                    "missing from every run; raise trace_entries to keep more",
                    snapshot.trace_dropped));
  }
}

[[noreturn]] void no_events(const std::string& path) {
  throw InputError(path,
                   "the snapshot holds no trace events to replay; record with trace_entries above 0 "
                   "(REMAT_ALLOC_CONF=trace_entries:1000000) or write a trace dump");
}

// Streams the events of a remat dump (a JSON Lines trace, or a snapshot's trace ring) into
// the replay, which begin() makes once the tag table is known.
template <typename Begin>
void replay_dump(const DumpFile& dump, RecordedInput& recorded, Begin begin) {
  renderer_for(dump, {"whatif", View::events, {}});
  if (dump.kind == "trace") {
    TraceFile trace(dump);
    recorded.kind = "trace";
    recorded.device = trace.header().header.device;
    if (const std::optional<AllocatorConfig>& config = trace.header().config) {
      recorded_config(recorded, config->text, false, "the trace header's config.text");
    } else {
      no_recorded_config(recorded, "this trace's header records no allocator settings (a trace written before remat "
                                   "recorded them, or by another producer)");
    }
    if (trace.header().dropped_records.value_or(0) > 0) {
      recorded.notes.push_back(
          fmt::format("the trace ring had overwritten {} records before the first event: frees of blocks allocated "
                      "earlier are skipped, and those blocks are missing from every run",
                      *trace.header().dropped_records));
    }
    recorded.followable = true;
    trace.stream(begin(trace.header().tags));
    return;
  }
  const Snapshot snapshot = read_document(dump, read_snapshot);
  if (snapshot.events.empty()) no_events(dump.path);
  record_snapshot(recorded, dump.kind, snapshot);
  EventSink& sink = begin(snapshot.tags);
  for (const Event& event : snapshot.events) sink.on_event(event);
}

// The replay's sink for a snapshot streaming by, started at its first event as a whole read starts
// it after reading the snapshot (an empty trace starts nothing). What the replay throws -- its
// settings refused, its own failures -- is kept and the rest of the events go by unreplayed, to be
// thrown once the stream ends: a snapshot that fails a check after that event is read whole, and
// refused for what it fails, as a whole read refuses it before replaying.
template <typename Begin>
class DeferredSink final : public EventSink {
 public:
  explicit DeferredSink(Begin& begin) : begin_(begin) {}

  EventSink& start(const TagTable& tags) {
    tags_ = tags;
    return *this;
  }
  void on_event(const Event& event) override {
    ++events_;
    if (error_) return;
    try {
      if (sink_ == nullptr) sink_ = &begin_(*tags_);
      sink_->on_event(event);
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  std::uint64_t events() const { return events_; }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  Begin& begin_;
  std::optional<TagTable> tags_;  // the stream's own goes with it; the replay's holders name regions from it
  EventSink* sink_ = nullptr;
  std::exception_ptr error_;
  std::uint64_t events_ = 0;
};

// A snapshot in a file, replayed as it streams by (renderers/streamed_snapshot.hpp): what the runs
// are set up with (the recorded settings, the device's memory) is read from the members before its
// trace, where the allocator writes them. A snapshot in another order, or one that fails a check,
// is read whole and replayed as replay_dump replays it.
template <typename Begin>
void replay_streaming(const std::string& file, RecordedInput& recorded, Begin begin) {
  bool set_up = false;
  StreamHooks hooks;
  hooks.on_array = [&](StreamedArray array, const DumpFile& so_far) {
    if (array != StreamedArray::events) return;
    record_snapshot(recorded, so_far.kind, read_document(so_far, read_snapshot));
    set_up = true;
  };
  DeferredSink<Begin> deferred(begin);
  const SnapshotInput input = open_streaming(
      file,
      [&](const TagTable& tags) -> EventSink& {
        if (!set_up) throw InputError("the snapshot's settings follow its trace: read it whole");
        return deferred.start(tags);
      },
      {}, hooks);
  if (!input.streamed) {
    recorded = RecordedInput{};
    replay_dump(input.file, recorded, begin);
    return;
  }
  if (deferred.events() == 0) no_events(input.file.path);
  deferred.rethrow();
}

template <typename Begin>
void replay_input(const WhatIfOptions& options, RecordedInput& recorded, Begin begin) {
  auto lines = std::make_unique<LineReader>(InputFile::open(options.file), kFirstChunk);
  const std::string name = lines->name();
  const std::string_view head = lines->peek(kSniffBytes);
  if (head.empty() || static_cast<unsigned char>(head[0]) != 0x80) {
    if (options.device >= 0) {
      throw UsageError(fmt::format("--device {}: {} is not a PyTorch snapshot pickle; a remat trace or snapshot "
                                   "records one device, so leave --device out",
                                   options.device, printable(name)));
    }
    std::error_code ignored;
    if (options.file != kStdinArgument && std::filesystem::is_regular_file(options.file, ignored)) {
      lines.reset();
      replay_streaming(options.file, recorded, begin);
      return;
    }
    const DumpFile dump = open_dump(std::move(lines));
    replay_dump(dump, recorded, begin);
    return;
  }
  // A PyTorch snapshot pickle: converted as `import` converts it, then replayed.
  const std::string bytes = lines->read_binary_rest();
  lines.reset();
  ImportResult imported;
  try {
    imported = import_torch_snapshot(bytes, options.device, name);
  } catch (const InputError& error) {
    throw InputError(name, error.what());
  }
  const DumpFile dump = dump_from_text(imported.text, name);
  const Snapshot snapshot = read_document(dump, read_snapshot);
  recorded.kind = "torch-pickle";
  recorded.device = imported.device;
  if (snapshot.events.empty()) {
    throw InputError(name, fmt::format("the PyTorch snapshot holds no trace events for device {} to replay; record "
                                       "with torch.cuda.memory._record_memory_history() before the steps you want, "
                                       "or pick the device with --device",
                                       imported.device));
  }
  if (imported.allocator_settings) {
    recorded_config(recorded, *imported.allocator_settings, true, "the pickle's allocator_settings");
  } else {
    no_recorded_config(recorded, "the pickle has no allocator_settings");
  }
  if (imported.skipped_events > 0) {
    recorded.notes.push_back(fmt::format("{} trace entries of kinds this replay does not know were left out",
                                         imported.skipped_events));
  }
  recorded.notes.push_back(
      "PyTorch records requested sizes: every run rounds them as its settings say, as the recorded allocator did");
  EventSink& sink = begin(snapshot.tags);
  for (const Event& event : snapshot.events) sink.on_event(event);
}

constexpr const char* kHelp =
    "Replay a recorded trace's allocations and frees, in order and per stream, through this project's caching pool "
    "on a virtual device (address ranges counted against a capacity, no memory touched), once under the recorded "
    "settings and once per --conf, all in one pass over the input; print the figures side by side.\n"
    "Inputs: a remat trace (JSON Lines, streamed), a remat snapshot holding its trace ring, or a PyTorch snapshot "
    "pickle recorded with torch.cuda.memory._record_memory_history() (its device_traces).\n"
    "Replay rules: alloc -> allocate(the requested size, stream); free_requested and at once free_completed -> free; "
    "a free_requested whose free_completed comes later -> free, the block held until then (as a block used on "
    "another stream waits); a free of an address allocated before the input's first event is skipped and counted; "
    "each run of consecutive segment_free events -> one empty_cache() (the recorded allocator gave cached memory "
    "back); oom is not replayed. On a remat trace or snapshot the run under the recorded settings follows the "
    "recording: segments at the recorded addresses, releases one by one as recorded; where it cannot, a note says "
    "from which event on it is its own replay.\n"
    "Figures: peak reserved and peak allocated bytes; reserved bytes when allocated first reached its peak; "
    "fragmentation at peak = (peak reserved - the most bytes allocated while reserved stood at its peak) / peak "
    "reserved; device allocations and releases (segments allocated or ranges mapped, and given back). With a capacity "
    "a run that cannot satisfy an allocation even after releasing its cache stops there, and the output names the "
    "event (number counted from 1, time, size, stream) and what held memory then. The recorded settings are a "
    "snapshot's or trace header's config.text, or a pickle's allocator_settings; where the input has none (a trace "
    "written before they were recorded, a pickle without them) the first run uses the defaults and is named "
    "`defaults`, not `recorded`. Details: docs/whatif.md.";

}  // namespace

void register_whatif(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("whatif", "Replay a trace through the caching pool under other allocator settings");
  command->footer(kHelp);  // the whole manual under `whatif --help`; one line in the subcommand list
  auto opts = std::make_shared<WhatIfOptions>();
  command->add_option("file", opts->file, "A remat trace (JSON Lines), a snapshot with its trace, or a PyTorch pickle")
      ->required();
  command->add_option("--conf", opts->confs,
                      "Settings for one more run, as REMAT_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF text over the recorded ones "
                      "(expandable_segments:True, max_split_size_mb:256, roundup_power2_divisions:4, ...); repeat "
                      "for more runs");
  auto* capacity_option = command->add_option(
      "--capacity", opts->capacity,
      "Device memory (85899345920, 80GiB, 1.5TiB, or 80GB = 80 x 10^9 bytes); default: the recorded device's "
      "total memory where the input has it, else 1 PiB");
  command->add_option("--device", opts->device, "For a PyTorch pickle: the device to replay (default: as import picks)")
      ->check(whole_number(0, INT32_MAX, "a CUDA device index"));
  add_output_options(*command, options);
  command->callback([opts, capacity_option, &options] {
    const OutputFormat format = options.format();
    std::optional<std::uint64_t> capacity;
    if (capacity_option->count() > 0) capacity = parse_capacity(opts->capacity);
    // A bad --conf is refused before the input is read.
    for (const std::string& text : opts->confs) (void)parse_conf(text, alloc::Config{}, nullptr);

    RecordedInput recorded;
    std::unique_ptr<WhatIfReplay> replay;
    std::string capacity_source;
    std::uint64_t capacity_bytes = 0;
    replay_input(*opts, recorded, [&](const TagTable& tags) -> EventSink& {
      const alloc::Config base = recorded.config.value_or(alloc::Config{});
      std::vector<alloc::Config> configs{base};
      for (const std::string& text : opts->confs) configs.push_back(parse_conf(text, base, &recorded.notes));
      if (capacity) {
        capacity_bytes = *capacity;
        capacity_source = "--capacity";
      } else if (recorded.device_total > 0) {
        capacity_bytes = recorded.device_total;
        capacity_source = "the recorded device's total memory";
      } else {
        capacity_bytes = kDefaultCapacity;
        capacity_source = "default (the input records no device total)";
      }
      replay = std::make_unique<WhatIfReplay>(configs, capacity_bytes,
                                              static_cast<int>(std::min<std::uint64_t>(recorded.device, INT32_MAX)),
                                              tags, recorded.followable);
      return *replay;
    });
    const WhatIfResult result{opts->file,     std::move(recorded), replay->counts(),
                              capacity_bytes, capacity_source,     replay->results()};
    if (format == OutputFormat::json) {
      std::cout << whatif_dump(result);
      std::cout.flush();
      return;
    }
    print(whatif_report(result), options);
  });
}

}  // namespace remat::report
