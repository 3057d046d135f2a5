#pragma once
// Counters kept globally and per tag. Updated under the allocator's lock.

#include <cstdint>

namespace remat::alloc {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::uint64_t total_added = 0;  // cumulative amount ever added

  void add(std::int64_t amount) {
    current += amount;
    total_added += static_cast<std::uint64_t>(amount);
    if (current > peak) peak = current;
  }
  void subtract(std::int64_t amount) { current -= amount; }
  void reset_peak() { peak = current; }
};

struct AllocatorStats {
  Stat allocated_bytes;  // blocks handed out (rounded sizes)
  Stat requested_bytes;  // what callers asked for
  Stat active_bytes;     // allocated plus freed blocks still waiting on stream events
  Stat reserved_bytes;   // segments obtained from the backend
  Stat allocations;      // live block count
  Stat segments;         // live segment count
  std::uint64_t num_ooms = 0;
  std::uint64_t num_alloc_retries = 0;  // cache released and allocation retried
  std::uint64_t num_invalid_frees = 0;  // unknown pointer, double free, wrong size
};

struct TagStats {
  Stat bytes;            // rounded block sizes
  Stat requested_bytes;  // sizes callers asked for
  Stat count;            // blocks
};

}  // namespace remat::alloc
