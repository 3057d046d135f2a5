#pragma once
// What `whatif` prints: the input, the configurations, each run's figures side by side, and where
// a run failed with what held memory then; as tables (text and CSV) or as a `whatif` dump
// (schemas/whatif.schema.json). The replay itself is analysis/whatif_replay.hpp.

#include "analysis/whatif_replay.hpp"
#include "output/table.hpp"

#include <remat/alloc/config.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::report {

// What the input recorded, beside its events.
struct RecordedInput {
  std::string kind;  // trace, snapshot, torch-pickle
  std::uint64_t device = 0;
  std::optional<alloc::Config> config;
  std::string config_source;  // where the recorded configuration came from, or why there is none
  std::uint64_t device_total = 0;
  // Recorded by this allocator, so the run under the recorded settings can follow the recording.
  bool followable = false;
  std::vector<std::string> notes;
};

// A whatif run: what it read and what each configuration's replay came to.
struct WhatIfResult {
  std::string input;  // the file argument (`-` for standard input)
  RecordedInput recorded;
  WhatIfCounts counts;
  std::uint64_t capacity = 0;
  std::string capacity_source;
  std::vector<WhatIfRun> runs;
};

Report whatif_report(const WhatIfResult& result);
// The `whatif` dump, JSON text ending in a newline.
std::string whatif_dump(const WhatIfResult& result);

}  // namespace remat::report
