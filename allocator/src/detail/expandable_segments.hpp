#pragma once
// Expandable segments: per stream and pool, one reservation of address space that the pool
// maps in whole granules from its base as it grows, with unmapped holes where it shrank inside.
// These types own the address space and its figures; PoolState (pool_state.hpp) cuts the
// mapped memory into blocks.

#include <remat/alloc/backend.hpp>

#include "block.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace remat::alloc::detail {

inline std::size_t round_up(std::size_t value, std::size_t step) { return (value + step - 1) / step * step; }

// Address space reserved for one stream and pool. Its blocks cover [base, base + extent) and
// `tail` is the last of them; all of that is mapped but the holes: unmapped blocks (whole
// granules given back while the blocks around them stayed), by address.
struct ExpandableSegment {
  std::uintptr_t base = 0;
  std::size_t reserved = 0;
  std::size_t extent = 0;  // mapped or a hole, from base
  std::size_t mapped = 0;  // extent less the holes
  Stream stream = 0;
  bool small = false;
  Block* tail = nullptr;                   // the block at the end of the extent
  std::map<std::uintptr_t, Block*> holes;  // unmapped blocks inside the extent, by address

  std::size_t room() const { return reserved - extent; }

  // The whole granules `block` of this segment covers, [low, high); empty when low >= high.
  std::pair<std::uintptr_t, std::uintptr_t> whole_granules(const Block& block, std::size_t granularity) const {
    return {base + round_up(block.address - base, granularity),
            base + (block.address + block.size - base) / granularity * granularity};
  }
};

// The expandable segments in use, one per stream and pool.
class ExpandableSegments {
 public:
  // The segment of `stream` and pool `small`, reserved on first use with room to map the whole
  // device and an eighth more in whole steps of `step` bytes (as PyTorch); nullptr when the
  // backend cannot reserve that much.
  ExpandableSegment* of(Stream stream, bool small, Backend& backend, std::size_t step) {
    for (const auto& segment : segments_) {
      if (segment->stream == stream && segment->small == small) return segment.get();
    }
    const std::size_t total = backend.memory_info().total_bytes;
    constexpr std::size_t kLargest = std::numeric_limits<std::size_t>::max();
    const bool fits = total <= kLargest - step && total / 8 < kLargest - step - total;
    const std::size_t reserved = fits ? round_up(total + total / 8, step) : kLargest / step * step;
    void* base = backend.reserve(reserved);
    if (base == nullptr) return nullptr;
    auto segment = std::make_unique<ExpandableSegment>();
    segment->base = reinterpret_cast<std::uintptr_t>(base);
    segment->reserved = reserved;
    segment->stream = stream;
    segment->small = small;
    return segments_.emplace_back(std::move(segment)).get();
  }

  // Gives `segment`'s reservation back (nothing of it may be mapped) and forgets it.
  void release(ExpandableSegment& segment, Backend& backend) {
    backend.release(reinterpret_cast<void*>(segment.base), segment.reserved);
    std::erase_if(segments_, [&](const auto& owned) { return owned.get() == &segment; });
  }

 private:
  std::vector<std::unique_ptr<ExpandableSegment>> segments_;
};

}  // namespace remat::alloc::detail
