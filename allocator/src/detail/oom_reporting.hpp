#pragma once
// What the pool hands its OOM reporting: the figures it owns, gathered under its lock, and
// the steps that run after the lock is released (the dump, the stderr line, the handler).

#include <remat/alloc/config.hpp>
#include <remat/alloc/oom.hpp>
#include <remat/alloc/stats.hpp>
#include <remat/alloc/trace.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::alloc::detail {

// Free blocks as the pool sees them when a request fails.
struct FreeSpace {
  std::int64_t largest_free_block = 0;
  std::int64_t releasable_bytes = 0;       // whole free segments
  std::int64_t fragmented_free_bytes = 0;  // free blocks inside segments that hold live ones
  std::int64_t free_blocks_in_split_segments = 0;
  PoolFreeSpace request_pool;  // of the pool the failed request goes to
};

// Whether a new segment of `size` bytes would take reserved memory past the memory_fraction
// cap `limit`. The pool refuses such a segment; the OOM report names the cap as the cause.
inline bool exceeds_reserved_cap(std::size_t reserved, std::size_t limit, std::size_t size) {
  return size > limit || reserved > limit - size;
}

struct PoolFigures {
  int device = 0;
  std::string_view backend;
  DeviceMemoryInfo memory{};
  const Config& config;
  std::size_t reserved_limit = Config::kUnlimited;  // the memory_fraction cap
  const AllocatorStats& stats;
  const std::vector<TagStats>& tag_stats;  // indexed by TagId
  const TraceRing& trace;
  FreeSpace free;
};

// The report: the pool's figures, holders by region, receive slot, site, phase and label
// from the per-tag statistics, the calling thread's tag stack and the last trace events.
OomReport build_oom_report(const PoolFigures& pool, std::size_t requested, std::size_t rounded,
                           std::size_t segment);

// At most one dump per interval (oom_dump_interval_ms; 0: no limit).
class OomDumpLimiter {
 public:
  bool take(std::size_t interval_ms);

 private:
  std::chrono::steady_clock::time_point last_{};
  bool dumped_ = false;
};

// Runs without the pool's lock: writes the report into `directory` (or $REMAT_OOM_DUMP_DIR)
// when `may_dump`, setting event.dump_path; prints the one-line summary to stderr; calls
// `handler`, reporting anything it throws.
void announce_out_of_memory(OomEvent& event, std::string directory, bool may_dump, const OomHandler& handler);

}  // namespace remat::alloc::detail
