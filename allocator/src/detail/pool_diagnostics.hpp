#pragma once
// What the pool tells about itself when something went wrong, read under its lock: the figures
// an out-of-memory report needs, and what a pointer handed to a bad free points at. Nothing on
// the cached pair's path reads this.

#include "../message_text.hpp"
#include "oom_reporting.hpp"
#include "pool_state.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace remat::alloc::detail {

// What the OOM report needs from the pool's own books, for a request that goes to the small
// pool or not; the rest comes from the per-tag statistics and the trace (detail/oom_reporting.hpp).
inline PoolFigures figures_for_oom_report(const PoolState& s, bool small_request) {
  FreeSpace free;
  free.request_pool.small = small_request;
  auto count = [&](const Block* block) {
    const auto bytes = static_cast<std::int64_t>(block->size);
    free.largest_free_block = std::max(free.largest_free_block, bytes);
    std::int64_t releasable = block->is_whole_segment() ? bytes : 0;
    if (block->expandable != nullptr) {
      // These can be unmapped.
      const auto [low, high] = block->expandable->whole_granules(*block, s.backend->granularity());
      releasable = high > low ? static_cast<std::int64_t>(high - low) : 0;
    }
    free.releasable_bytes += releasable;
    const bool in_request_pool = block->small == small_request;
    if (in_request_pool) free.request_pool.free_bytes += block->size;
    if (releasable < bytes) {
      free.fragmented_free_bytes += bytes - releasable;
      ++free.free_blocks_in_split_segments;
      if (in_request_pool) {
        free.request_pool.fragmented_free_bytes += static_cast<std::uint64_t>(bytes - releasable);
        ++free.request_pool.free_blocks_in_split_segments;
      }
    }
  };
  s.small_pool.for_each(count);
  s.large_pool.for_each(count);
  return {s.backend->device(), s.backend->name(), s.backend->memory_info(), s.config, s.reserved_limit,
          s.books.device_stats(), s.books.tag_stats(), s.books.trace(), free};
}

inline std::string describe_bad_pointer(const PoolState& s, std::uintptr_t address) {
  const std::string where = format_address(address);
  if (const Block* block = s.block_holding(address)) {
    if (!block->allocated && address == block->address) {
      return "free of " + where + ", which is already free (double free); free each pointer exactly once";
    }
    if (!block->allocated) {
      return "free of " + where + ", which lies inside free cached memory: a pointer past the start of its "
             "block, or a double free of a block since merged with its free neighbours; free the pointer that "
             "allocation returned, once";
    }
    return "free of " + where + ", which points inside the live block at " + format_address(block->address) +
           "; free the pointer that allocation returned";
  }
  return "free of " + where + ", which this allocator (device " + std::to_string(s.backend->device()) +
         ") never returned; free it with the allocator that allocated it";
}

}  // namespace remat::alloc::detail
