#pragma once
// Counters kept globally and per tag. Updated under the allocator's lock.

#include <array>
#include <cstddef>
#include <cstdint>

namespace remat::alloc {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::uint64_t total_added = 0;  // cumulative amount added (PyTorch's "allocated")
  std::int64_t current_at_reset = 0;  // current when the totals were last reset

  void add(std::int64_t amount) {
    current += amount;
    total_added += static_cast<std::uint64_t>(amount);
    if (current > peak) peak = current;
  }
  void subtract(std::int64_t amount) { current -= amount; }
  void reset_peak() { peak = current; }
  void reset_accumulated() {
    total_added = 0;
    current_at_reset = current;
  }
  // Cumulative amount subtracted (PyTorch's "freed"), since the totals were last reset: what was
  // added less what it grew by.
  std::uint64_t total_subtracted() const {
    return total_added - static_cast<std::uint64_t>(current - current_at_reset);
  }
};

// PyTorch splits its figures between two pools: blocks of at most 1 MiB, in 2 MiB segments,
// and the rest.
enum class PoolKind : std::uint8_t { small, large };

struct PoolStats {
  Stat allocated_bytes;
  Stat requested_bytes;
  Stat active_bytes;
  Stat reserved_bytes;
  Stat inactive_split_bytes;
  Stat allocations;
  Stat active_blocks;
  Stat segments;
  Stat inactive_split;
};

struct AllocatorStats {
  Stat allocated_bytes;  // blocks handed out (rounded sizes)
  Stat requested_bytes;  // what callers asked for
  Stat active_bytes;     // allocated plus freed blocks still waiting on stream events
  Stat reserved_bytes;   // segments obtained from the backend
  Stat allocations;      // live block count
  Stat segments;         // live segment count
  Stat active_blocks;    // allocated blocks and freed ones still waiting on stream events
  // Free blocks that share their segment with other blocks (PyTorch's inactive split):
  // memory that is cached but can only serve requests that fit between its neighbours.
  Stat inactive_split;
  Stat inactive_split_bytes;
  // Blocks and fixed segments of at least max_split_size (when it is set), as PyTorch counts them.
  Stat oversize_allocations;
  Stat oversize_segments;
  std::array<PoolStats, 2> pools;  // indexed by PoolKind; each whole-device figure is their sum
  std::uint64_t num_ooms = 0;
  std::uint64_t num_alloc_retries = 0;  // cache released and allocation retried
  // Waits for every stream's pending frees (PyTorch's num_sync_all_streams); the pool waits so
  // only before retrying a failed allocation, as its empty_cache takes only completed frees.
  std::uint64_t num_sync_all_streams = 0;
  std::uint64_t num_invalid_frees = 0;  // unknown pointer, double free, wrong size
  // Per category (indexed by Category, from tags.hpp): bytes held now (rounded and requested),
  // and the same when allocated_bytes last reached its peak, so a step's peak can be split by
  // category without a trace.
  std::array<std::int64_t, 8> category_bytes{}, category_requested_bytes{};
  std::array<std::int64_t, 8> category_bytes_at_peak{}, category_requested_bytes_at_peak{};

  PoolStats& pool(bool small) { return pools[static_cast<std::size_t>(small ? PoolKind::small : PoolKind::large)]; }
  const PoolStats& pool(PoolKind kind) const { return pools[static_cast<std::size_t>(kind)]; }
};

struct TagStats {
  Stat bytes;            // rounded block sizes
  Stat requested_bytes;  // sizes callers asked for
  Stat count;            // blocks
};

}  // namespace remat::alloc
