#pragma once
// In-memory form of the report dumps the checkpoint runtime and the allocator write once:
// remat-trace, memory-report, saved-report and oom. Field meanings follow their schemas in
// schemas/.

#include "model/dump.hpp"

#include <remat/alloc/oom.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

struct RegionDecision {
  std::string name;
  bool saved = false;  // "save"; otherwise "recompute"
};

struct CheckpointScope {
  std::string name;
  std::vector<RegionDecision> regions;
};

struct RematTraceDump {
  DumpHeader header;
  std::vector<CheckpointScope> scopes;
};

struct ResidentTensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::string dtype;
  std::uint64_t storage_bytes = 0;
  std::string site;  // empty when the storage has no site annotation
};

struct ResidentRegion {
  std::string region;
  std::uint64_t bytes = 0;  // each storage billed once
  std::uint64_t storages = 0;
  std::vector<ResidentTensor> tensors;
};

struct MemoryReportDump {
  DumpHeader header;
  std::string checkpoint;
  std::vector<ResidentRegion> regions;

  std::uint64_t total_bytes() const {
    std::uint64_t total = 0;
    for (const ResidentRegion& region : regions) total += region.bytes;
    return total;
  }
};

// `bytes` and `storages` are totals over the group's `count` members.
struct SavedGroup {
  std::string label;
  std::uint64_t bytes = 0;
  std::uint64_t count = 1;
  std::uint64_t storages = 0;
};

struct SavedReportDump {
  DumpHeader header;
  std::uint64_t total_bytes = 0;
  std::uint64_t region_bytes = 0;
  std::uint64_t outside_bytes = 0;
  std::uint64_t regions = 0;
  std::vector<SavedGroup> region_groups;
  std::vector<SavedGroup> node_groups;
};

using alloc::OomHolder;
using alloc::OomHolders;

struct OomEvent {
  Action action = Action::alloc;
  std::int64_t time_us = 0;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::string region;
};

// The figures an OOM report gives about the failed request and the allocator's state, as the
// allocator writes them.
struct OomNumbers : alloc::OomFigures {
  // The limit the request ran into; empty in a report written before the cause was recorded.
  std::optional<alloc::OomCause> cause;
  std::uint64_t internal_bytes = 0;  // rounding slack in allocated blocks: allocated - requested
};

struct OomDump {
  DumpHeader header;
  std::string backend;
  OomNumbers numbers;
  std::uint64_t num_ooms = 0;
  std::string config;
  OomHolders holders;
  std::vector<std::string> tag_stack;
  std::vector<OomEvent> last_events;
};

}  // namespace remat::report
