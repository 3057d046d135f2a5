#pragma once
// What held the memory when a request failed: built under the allocator's lock from its
// per-tag statistics (no copy of the block list, so it stays small and fast with any number
// of live blocks), written as an "oom" dump, summarised in one stderr line.

#include <remat/alloc/backend.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/alloc/trace.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remat::alloc {

inline constexpr int kOomSchemaVersion = 1;
inline constexpr std::size_t kOomTopHolders = 10;
inline constexpr std::size_t kOomTraceEvents = 64;

struct OomHolder {
  std::string name;           // region path, receive slot "1F0", site, label, category, module, or "<untagged>"
  std::uint64_t bytes = 0;   // live, rounded
  std::uint64_t blocks = 0;
  std::uint64_t saved_bytes = 0;  // of those, allocated under policy save
};

struct OomTraceEvent {
  TraceEvent event;
  std::string region;  // of the event's tag, "" when untagged
};

// Which limit the failed request ran into.
enum class OomCause : std::uint8_t {
  request_exceeds_device,  // the request's segment alone is larger than the whole device
  memory_fraction_cap,     // reserved bytes would pass the memory_fraction cap
  device_full,             // the device (cudaMalloc, or the host capacity) had no room
};
std::string_view to_string(OomCause cause);

// The free cached memory of the pool a failed request goes to (the small pool: requests of at
// most 1 MiB, in 2 MiB segments; the large pool: the rest). Only its blocks, or memory handed
// back to the device, can hold the request: free small-pool blocks never hold a large request.
struct PoolFreeSpace {
  bool small = false;
  std::uint64_t free_bytes = 0;
  std::uint64_t fragmented_free_bytes = 0;  // of them, in segments that hold live blocks
  std::uint64_t free_blocks_in_split_segments = 0;
};

// An OOM report's figures: the request, the device and the pool when it failed. The allocator
// fills them; remat-report reads them back from the dump.
struct OomFigures {
  double memory_fraction = 1.0;
  std::uint64_t reserved_limit_bytes = 0;  // the memory_fraction cap; 0 when none is set
  std::uint64_t requested_bytes = 0;
  std::uint64_t rounded_bytes = 0;
  std::uint64_t segment_bytes = 0;  // the segment the allocator tried to obtain
  DeviceMemoryInfo memory{};
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
  std::optional<PoolFreeSpace> request_pool;  // absent in a report written before it was recorded
};

// Who held the memory, by each grouping of the tags: largest first, the top kOomTopHolders.
// by_label is empty unless some of the memory held carries a label (set_label); by_category and
// by_module are empty unless some of it carries a category (remat_alloc.track).
struct OomHolders {
  std::vector<OomHolder> by_region, by_recv_slot, by_site, by_phase, by_label, by_category, by_module;
};

struct OomReport : OomFigures, OomHolders {
  int device = 0;
  std::string backend;
  OomCause cause = OomCause::device_full;
  std::uint64_t num_ooms = 0;
  std::string config;
  std::vector<std::string> tag_stack;  // of the failing thread, outermost first
  std::vector<OomTraceEvent> last_events;  // oldest first
};

// What an observer learns when a request cannot be met.
struct OomEvent {
  int device = 0;
  std::size_t requested_bytes = 0;
  std::size_t rounded_bytes = 0;
  DeviceMemoryInfo memory{};
  std::int64_t reserved_bytes = 0;
  std::int64_t allocated_bytes = 0;
  TagId tag = 0;  // tag in force at the failed request
  std::string message;
  std::shared_ptr<const OomReport> report;
  std::string dump_path;  // "" when no report was written
};
using OomHandler = std::function<void(const OomEvent&)>;

std::string oom_report_to_json(const OomReport& report);
// What happened and what to change, one sentence, for the error the caller sees.
std::string oom_message(const OomReport& report);
// "remat: out of memory on device 0 (host): tried to allocate 10.00 MiB ...; top holders:
// layers.0::attention 40.00 MiB, ...; report: PATH". `write_error` says why no report was
// written to a configured directory ("" when none was configured or it was written).
std::string oom_summary_line(const OomReport& report, const std::string& dump_path, const std::string& write_error);
// oom-<host>-r<rank>-p<pid>-d<device>-<UTC time>.json inside `directory`.
std::string oom_dump_path(const std::string& directory, int device);

}  // namespace remat::alloc
