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

struct OomHolder {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint64_t blocks = 0;
  std::uint64_t saved_bytes = 0;  // of `bytes`, allocated under policy save
};

struct OomEvent {
  Action action = Action::alloc;
  std::int64_t time_us = 0;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::string region;
};

// The numbers an OOM report gives about the failed request and the allocator's state.
struct OomNumbers {
  // The limit the request ran into, as the allocator records it; empty in a report written
  // before the cause was recorded.
  std::optional<alloc::OomCause> cause;
  double memory_fraction = 1.0;
  std::uint64_t reserved_limit_bytes = 0;  // the memory_fraction cap in bytes; 0 when none
  std::uint64_t requested_bytes = 0;
  std::uint64_t rounded_bytes = 0;
  std::uint64_t segment_bytes = 0;
  std::uint64_t device_free_bytes = 0;
  std::uint64_t device_total_bytes = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t requested_live_bytes = 0;
  std::uint64_t active_bytes = 0;
  std::uint64_t segments = 0;
  std::uint64_t largest_free_block = 0;
  std::uint64_t cached_free_bytes = 0;      // reserved but not active
  std::uint64_t releasable_bytes = 0;       // whole free segments: what empty-cache returns
  std::uint64_t fragmented_free_bytes = 0;  // free bytes inside segments that hold live blocks
  std::uint64_t free_blocks_in_split_segments = 0;
  std::uint64_t internal_bytes = 0;
};

struct OomHolders {
  std::vector<OomHolder> by_region;
  std::vector<OomHolder> by_recv_slot;
  std::vector<OomHolder> by_site;
  std::vector<OomHolder> by_phase;
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
