#include "renderers/whatif_report.hpp"

#include "output/dump_header.hpp"
#include "output/json_text.hpp"
#include "reader/input_file.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace remat::report {

namespace {

constexpr int kWhatIfSchemaVersion = 1;

// The first run is "recorded" only where the input recorded its settings: without them it is the defaults.
std::string run_name(std::size_t index, const RecordedInput& recorded) {
  if (index > 0) return fmt::format("conf {}", index);
  return recorded.config ? "recorded" : "defaults";
}

// What the input said about itself, then what the replay met in it.
std::vector<std::string> all_notes(const RecordedInput& recorded, const WhatIfCounts& counts,
                                   const std::vector<WhatIfRun>& runs) {
  std::vector<std::string> notes = recorded.notes;
  if (!runs.empty() && runs[0].followed_recording) {
    notes.push_back(
        fmt::format("the first run ({}) followed the recording to its end, each segment at its recorded "
                    "address and each release as recorded: its figures are the recording's",
                    run_name(0, recorded)));
  } else if (!runs.empty() && runs[0].drift) {
    notes.push_back(
        fmt::format("the first run ({}) followed the recording until event {} ({}); from there on it is "
                    "this pool's own replay under those settings, and its figures may differ from the "
                    "recording's",
                    run_name(0, recorded), runs[0].drift->event, runs[0].drift->reason));
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].failure && runs[i].failure->replay_limit) {
      notes.push_back(fmt::format("{} stopped at event {}, not out of the device's memory: {}", run_name(i, recorded),
                                  runs[i].failure->event, runs[i].failure->message));
    }
  }
  if (counts.events == 0) notes.push_back("the input holds no events: every figure is 0");
  if (counts.recorded_ooms > 0) {
    notes.push_back(fmt::format(
        "the recording ran out of memory {} time(s) (its oom events): a request that failed there is no alloc event, "
        "so no run here replays it, and a run without a failure does not say that setting would have avoided it",
        counts.recorded_ooms));
  }
  if (counts.skipped_frees > 0) {
    notes.push_back(
        fmt::format("{} frees of addresses with no live allocation in the input (allocated before its "
                    "first event, or freed twice) were skipped",
                    counts.skipped_frees));
  }
  if (counts.frees_not_completed > 0) {
    notes.push_back(
        fmt::format("{} blocks had a free_requested but no free_completed before their address was "
                    "allocated again: each was freed at that alloc",
                    counts.frees_not_completed));
  }
  return notes;
}

}  // namespace

Report whatif_report(const WhatIfResult& result) {
  const auto& [file, recorded, counts, capacity, capacity_source, runs] = result;
  Report report;
  Table input = key_value_table("input", "Input");
  add_field(input, "input", file == kStdinArgument ? Cell::text(std::string(kStdinName)) : Cell::name(file));
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

  Table confs{
      .id = "configurations", .title = "Configurations", .columns = {{"run", "run", false}, {"conf", "conf", false}}};
  for (std::size_t i = 0; i < runs.size(); ++i)
    confs.rows.push_back({Cell::text(run_name(i, recorded)), Cell::text(runs[i].conf)});
  report.tables.push_back(std::move(confs));

  Table figures{.id = "runs", .title = "Replayed", .columns = {{"figure", "figure", false}}};
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

  Table failures{.id = "failures",
                 .title = "First failing allocation",
                 .columns = {{"run", "run", false},
                             {"event", "event", true},
                             {"since first", "since_first_us", true},
                             {"time_us", "time_us", true, false},
                             {"size", "size", true},
                             {"stream", "stream", true},
                             {"reserved", "reserved", true},
                             {"allocated", "allocated", true}}};
  Table holders{
      .id = "holders",
      .title = "What held memory then (live bytes by region)",
      .columns = {
          {"run", "run", false}, {"region", "region", false}, {"bytes", "bytes", true}, {"blocks", "blocks", true}}};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i].failure) continue;
    const WhatIfFailure& f = *runs[i].failure;
    failures.rows.push_back({Cell::text(run_name(i, recorded)), Cell::count(f.event), Cell::time(f.since_first_us),
                             Cell::integer(f.time_us), Cell::bytes(f.size), Cell::count(f.stream),
                             Cell::bytes(f.reserved_bytes), Cell::bytes(f.allocated_bytes)});
    for (const WhatIfHolder& h : f.holders) {
      holders.rows.push_back({Cell::text(run_name(i, recorded)),
                              h.region.empty() ? Cell::text("(untagged)") : Cell::name(h.region), Cell::bytes(h.bytes),
                              Cell::count(h.count)});
    }
  }
  if (!failures.rows.empty()) report.tables.push_back(std::move(failures));
  if (!holders.rows.empty()) report.tables.push_back(std::move(holders));
  report.notes = all_notes(recorded, counts, runs);
  return report;
}

std::string whatif_dump(const WhatIfResult& result) {
  const auto& [file, recorded, counts, capacity, capacity_source, runs] = result;
  nlohmann::ordered_json root = dump_header_json("whatif", kWhatIfSchemaVersion, recorded.device);
  root["input"] = {{"name", file == kStdinArgument ? std::string(kStdinName) : file},
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
      for (const WhatIfHolder& h : f.holders)
        holders.push_back({{"region", h.region}, {"bytes", h.bytes}, {"count", h.count}});
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

}  // namespace remat::report
