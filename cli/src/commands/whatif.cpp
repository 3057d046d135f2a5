// `remat-report whatif`: replays a recorded trace through the project's caching pool on a
// virtual device under the recorded settings and under others, side by side in one pass
// (analysis/whatif_replay.hpp), and prints what each would have reserved, or where it fails.

#include "analysis/whatif_replay.hpp"
#include "commands/command.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"
#include "core/terminal_text.hpp"
#include "interop/torch_snapshot.hpp"
#include "output/dump_header.hpp"
#include "output/json_text.hpp"
#include "reader/dump_file.hpp"
#include "reader/dump_reader.hpp"
#include "reader/input_file.hpp"
#include "reader/input_sniff.hpp"
#include "reader/trace_file.hpp"
#include "renderers/document.hpp"
#include "renderers/renderer.hpp"

#include <remat/alloc/config.hpp>
#include <remat/alloc/dump.hpp>
#include <remat/alloc/errors.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <memory>

namespace remat::report {

namespace {

constexpr int kWhatIfSchemaVersion = 1;
constexpr std::uint64_t kDefaultCapacity = std::uint64_t{1} << 50;  // 1 PiB: nothing fails
constexpr std::uint64_t kLargestCapacity = std::uint64_t{1} << 52;  // 4 PiB
constexpr std::size_t kFirstChunk = std::size_t{1} << 16;

struct WhatIfOptions {
  std::string file;
  std::vector<std::string> confs;
  std::string capacity;
  std::int64_t device = -1;
};

// What the input recorded, beside its events.
struct Recorded {
  std::string kind;  // trace, snapshot, torch-pickle
  std::uint64_t device = 0;
  std::optional<alloc::Config> config;
  std::string config_source;  // where the recorded configuration came from, or why there is none
  std::uint64_t device_total = 0;
  // Recorded by this allocator, so the run under the recorded settings can follow the recording.
  bool followable = false;
  std::vector<std::string> notes;
};

std::uint64_t parse_capacity(const std::string& given) {
  // " 80GB" as "80 GB" and "80GB": white space around the figure means nothing.
  const std::size_t first = given.find_first_not_of(" \t");
  const std::string text =
      first == std::string::npos ? std::string() : given.substr(first, given.find_last_not_of(" \t") - first + 1);
  const ByteSize size = parse_byte_size(text, /*decimal_units=*/true);
  if (size.problem == ByteSize::Problem::too_large || (size.problem == ByteSize::Problem::none && size.bytes > kLargestCapacity)) {
    throw UsageError(fmt::format("--capacity {}: more than 4 PiB, the most a replayed device may have (each "
                                 "expandable segment reserves the device's size and an eighth more of the 64-bit "
                                 "address space); give the device's memory, such as 80GB or 80GiB",
                                 printable(text)));
  }
  if (size.problem != ByteSize::Problem::none || size.bytes == 0) {
    throw UsageError(fmt::format("--capacity {}: give the device's memory in bytes, 1 or more, as a whole number "
                                 "with an optional unit, B, KiB, MiB, GiB, TiB, PiB (powers of 1024) or kB, MB, GB, "
                                 "TB, PB (powers of 1000): 85899345920, 80GiB or 80GB",
                                 text.empty() ? std::string("'' (empty)") : printable(text)));
  }
  return size.bytes;
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
    return alloc::Config::parse(text, base, "--conf");
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
void recorded_config(Recorded& recorded, const std::string& text, bool pytorch, const std::string& source) {
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

void no_recorded_config(Recorded& recorded, std::string_view why) {
  recorded.config_source = "defaults (none recorded)";
  recorded.notes.push_back(fmt::format("{}: the first run uses the default settings; pass --conf with the job's "
                                       "REMAT_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF text to compare against it",
                                       why));
}

// Streams the events of a remat dump (a JSON Lines trace, or a snapshot's trace ring) into
// the replay, which begin() makes once the tag table is known.
template <typename Begin>
void replay_dump(const DumpFile& dump, Recorded& recorded, Begin begin) {
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
  recorded.kind = dump.kind;
  recorded.device = snapshot.header.device;
  recorded.device_total = snapshot.device_total_bytes;
  if (snapshot.events.empty()) {
    throw InputError(dump.path, "the snapshot holds no trace events to replay; record with trace_entries above 0 "
                                "(REMAT_ALLOC_CONF=trace_entries:1000000) or write a trace dump");
  }
  if (snapshot.header.producer == kImportProducer) {
    no_recorded_config(recorded, "the snapshot was imported from a PyTorch pickle, whose allocator settings it does "
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
  EventSink& sink = begin(snapshot.tags);
  for (const Event& event : snapshot.events) sink.on_event(event);
}

template <typename Begin>
void replay_input(const WhatIfOptions& options, Recorded& recorded, Begin begin) {
  auto lines = std::make_unique<LineReader>(InputFile::open(options.file), kFirstChunk);
  const std::string name = lines->name();
  const std::string_view head = lines->peek(kSniffBytes);
  if (head.empty() || static_cast<unsigned char>(head[0]) != 0x80) {
    if (options.device >= 0) {
      throw UsageError(fmt::format("--device {}: {} is not a PyTorch snapshot pickle; a remat trace or snapshot "
                                   "records one device, so leave --device out",
                                   options.device, printable(name)));
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

// The first run is "recorded" only where the input recorded its settings: without them it is the defaults.
std::string run_name(std::size_t index, const Recorded& recorded) {
  if (index > 0) return fmt::format("conf {}", index);
  return recorded.config ? "recorded" : "defaults";
}

// What the input said about itself, then what the replay met in it.
std::vector<std::string> all_notes(const Recorded& recorded, const WhatIfCounts& counts,
                                   const std::vector<WhatIfRun>& runs) {
  std::vector<std::string> notes = recorded.notes;
  if (!runs.empty() && runs[0].followed_recording) {
    notes.push_back(fmt::format("the first run ({}) followed the recording to its end, each segment at its recorded "
                                "address and each release as recorded: its figures are the recording's",
                                run_name(0, recorded)));
  } else if (!runs.empty() && runs[0].drift) {
    notes.push_back(fmt::format("the first run ({}) followed the recording until event {} ({}); from there on it is "
                                "this pool's own replay under those settings, and its figures may differ from the "
                                "recording's",
                                run_name(0, recorded), runs[0].drift->event, runs[0].drift->reason));
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].failure && runs[i].failure->replay_limit) {
      notes.push_back(fmt::format("{} stopped at event {}, not out of the device's memory: {}",
                                  run_name(i, recorded),
                                  runs[i].failure->event, runs[i].failure->message));
    }
  }
  if (counts.events == 0) notes.push_back("the input holds no events: every figure is 0");
  if (counts.skipped_frees > 0) {
    notes.push_back(fmt::format("{} frees of addresses with no live allocation in the input (allocated before its "
                                "first event, or freed twice) were skipped",
                                counts.skipped_frees));
  }
  if (counts.frees_not_completed > 0) {
    notes.push_back(fmt::format("{} blocks had a free_requested but no free_completed before their address was "
                                "allocated again: each was freed at that alloc",
                                counts.frees_not_completed));
  }
  return notes;
}

Report text_report(const WhatIfOptions& options, const Recorded& recorded, const WhatIfCounts& counts,
                   std::uint64_t capacity, const std::string& capacity_source, const std::vector<WhatIfRun>& runs) {
  Report report;
  Table input = key_value_table("input", "Input");
  add_field(input, "input", options.file == kStdinArgument ? Cell::text(std::string(kStdinName)) : Cell::name(options.file));
  add_field(input, "kind", Cell::text(recorded.kind));
  add_field(input, "events", Cell::count(counts.events));
  add_field(input, "allocs", Cell::count(counts.allocs));
  add_field(input, "frees", Cell::count(counts.frees));
  add_field(input, "held_frees", Cell::count(counts.held_frees));
  add_field(input, "skipped_frees", Cell::count(counts.skipped_frees));
  add_field(input, "empty_cache_calls", Cell::count(counts.empty_cache_calls));
  add_field(input, "ignored_events", Cell::count(counts.ignored));
  add_field(input, "capacity", Cell::bytes(capacity));
  add_field(input, "capacity_from", Cell::text(capacity_source));
  add_field(input, "recorded_config_from", Cell::text(recorded.config_source));
  report.tables.push_back(std::move(input));

  Table confs;
  confs.id = "configurations";
  confs.title = "Configurations";
  confs.columns = {{"run", "run", false}, {"conf", "conf", false}};
  for (std::size_t i = 0; i < runs.size(); ++i) confs.rows.push_back({Cell::text(run_name(i, recorded)), Cell::text(runs[i].conf)});
  report.tables.push_back(std::move(confs));

  Table figures;
  figures.id = "runs";
  figures.title = "Replayed";
  figures.columns = {{"figure", "figure", false}};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string title = run_name(i, recorded);
    std::string key = title;
    for (char& c : key) c = c == ' ' ? '_' : c;
    figures.columns.push_back({title, key, true});
  }
  auto row = [&](const std::string& name, auto cell) {
    std::vector<Cell> cells{Cell::text(name)};
    for (const WhatIfRun& run : runs) cells.push_back(cell(run));
    figures.rows.push_back(std::move(cells));
  };
  row("peak_reserved", [](const WhatIfRun& r) { return Cell::bytes(r.peak_reserved); });
  row("peak_allocated", [](const WhatIfRun& r) { return Cell::bytes(r.peak_allocated); });
  row("reserved_at_allocated_peak", [](const WhatIfRun& r) { return Cell::bytes(r.reserved_at_allocated_peak); });
  row("fragmentation_at_peak", [](const WhatIfRun& r) { return Cell::share(r.fragmentation_at_peak); });
  row("device_allocations", [](const WhatIfRun& r) { return Cell::count(r.device_allocations); });
  row("device_releases", [](const WhatIfRun& r) { return Cell::count(r.device_releases); });
  row("alloc_retries", [](const WhatIfRun& r) { return Cell::count(r.alloc_retries); });
  row("final_reserved", [](const WhatIfRun& r) { return Cell::bytes(r.final_reserved); });
  row("events_replayed", [](const WhatIfRun& r) { return Cell::count(r.events_replayed); });
  row("first_failing_event",
      [](const WhatIfRun& r) { return r.failure ? Cell::count(r.failure->event) : Cell::none(); });
  report.tables.push_back(std::move(figures));

  Table failures;
  failures.id = "failures";
  failures.title = "First failing allocation";
  failures.columns = {{"run", "run", false},           {"event", "event", true},
                      {"since first", "since_first_us", true}, {"time_us", "time_us", true, false},
                      {"size", "size", true},          {"stream", "stream", true},
                      {"reserved", "reserved", true},  {"allocated", "allocated", true}};
  Table holders;
  holders.id = "holders";
  holders.title = "What held memory then (live bytes by region)";
  holders.columns = {{"run", "run", false}, {"region", "region", false}, {"bytes", "bytes", true},
                     {"blocks", "blocks", true}};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i].failure) continue;
    const WhatIfFailure& f = *runs[i].failure;
    failures.rows.push_back({Cell::text(run_name(i, recorded)), Cell::count(f.event), Cell::time(f.since_first_us),
                             Cell::integer(f.time_us), Cell::bytes(f.size), Cell::count(f.stream),
                             Cell::bytes(f.reserved_bytes), Cell::bytes(f.allocated_bytes)});
    for (const WhatIfHolder& h : f.holders) {
      holders.rows.push_back({Cell::text(run_name(i, recorded)), h.region.empty() ? Cell::text("(untagged)") : Cell::name(h.region),
                              Cell::bytes(h.bytes), Cell::count(h.count)});
    }
  }
  if (!failures.rows.empty()) report.tables.push_back(std::move(failures));
  if (!holders.rows.empty()) report.tables.push_back(std::move(holders));
  report.notes = all_notes(recorded, counts, runs);
  return report;
}

std::string whatif_dump(const WhatIfOptions& options, const Recorded& recorded, const WhatIfCounts& counts,
                        std::uint64_t capacity, const std::string& capacity_source, const std::vector<WhatIfRun>& runs) {
  nlohmann::ordered_json root = dump_header_json("whatif", kWhatIfSchemaVersion, recorded.device);
  root["input"] = {{"name", options.file == kStdinArgument ? std::string(kStdinName) : options.file},
                   {"kind", recorded.kind},
                   {"events", counts.events},
                   {"replayed", counts.allocs + counts.frees + counts.empty_cache_calls},
                   {"allocs", counts.allocs},
                   {"frees", counts.frees},
                   {"held_frees", counts.held_frees},
                   {"skipped_frees", counts.skipped_frees},
                   {"empty_cache_calls", counts.empty_cache_calls},
                   {"ignored_events", counts.ignored}};
  root["capacity_bytes"] = capacity;
  root["capacity_from"] = capacity_source;
  root["recorded_config_from"] = recorded.config_source;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const WhatIfRun& r = runs[i];
    nlohmann::ordered_json failure = nullptr;
    if (r.failure) {
      const WhatIfFailure& f = *r.failure;
      nlohmann::ordered_json holders = nlohmann::ordered_json::array();
      for (const WhatIfHolder& h : f.holders) holders.push_back({{"region", h.region}, {"bytes", h.bytes}, {"count", h.count}});
      failure = {{"event", f.event},
                 {"time_us", f.time_us},
                 {"since_first_us", f.since_first_us},
                 {"size", f.size},
                 {"stream", f.stream},
                 {"reserved_bytes", f.reserved_bytes},
                 {"allocated_bytes", f.allocated_bytes},
                 {"holders", std::move(holders)},
                 {"message", f.message}};
    }
    list.push_back({{"name", run_name(i, recorded)},
                    {"conf", r.conf},
                    {"peak_reserved", r.peak_reserved},
                    {"peak_allocated", r.peak_allocated},
                    {"reserved_at_allocated_peak", r.reserved_at_allocated_peak},
                    {"allocated_at_reserved_peak", r.allocated_at_reserved_peak},
                    {"fragmentation_at_peak", r.fragmentation_at_peak},
                    {"device_allocations", r.device_allocations},
                    {"device_releases", r.device_releases},
                    {"alloc_retries", r.alloc_retries},
                    {"final_reserved", r.final_reserved},
                    {"final_allocated", r.final_allocated},
                    {"events_replayed", r.events_replayed},
                    {"followed_recording", r.followed_recording},
                    {"drift", r.drift ? nlohmann::ordered_json{{"event", r.drift->event}, {"reason", r.drift->reason}}
                                      : nlohmann::ordered_json(nullptr)},
                    {"failure", std::move(failure)}});
  }
  root["runs"] = std::move(list);
  root["notes"] = all_notes(recorded, counts, runs);
  return json_text(root, 2) + "\n";
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
  auto* capacity_option = command->add_option("--capacity", opts->capacity,
                      "Device memory (85899345920, 80GiB, or 80GB = 80 x 10^9 bytes); default: the recorded device's "
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

    Recorded recorded;
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
    const std::vector<WhatIfRun> runs = replay->results();
    if (format == OutputFormat::json) {
      std::cout << whatif_dump(*opts, recorded, replay->counts(), capacity_bytes, capacity_source, runs);
      std::cout.flush();
      return;
    }
    print(text_report(*opts, recorded, replay->counts(), capacity_bytes, capacity_source, runs), options);
  });
}

}  // namespace remat::report
