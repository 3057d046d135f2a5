#pragma once
// Memory from the backend for the pool, under its lock: fixed segments opened and given back, and
// pages mapped into expandable segments (into a hole, else at the end) and unmapped out of them,
// each counted in the books. Functions over the pool's state (pool_state.hpp), whose blocks they
// split, merge and pool; nothing on the cached pair's path calls them.

#include "pool_state.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>

namespace remat::alloc::detail {

// One small or large segment, in whole granules of the backend.
inline std::size_t growth_step(const PoolState& s, bool small) {
  return std::lcm(small ? kSmallSegmentSize : s.config.large_segment_size_bytes, s.backend->granularity());
}

// Maps `bytes` at `address` of the segment and counts them; false when the cap or the device
// has no room.
inline bool map_pages(PoolState& s, ExpandableSegment& segment, std::uintptr_t address, std::size_t bytes) {
  if (exceeds_reserved_cap(s.books.reserved_bytes(), s.reserved_limit, bytes) ||
      !s.backend->map(reinterpret_cast<void*>(address), bytes)) {
    return false;
  }
  segment.mapped += bytes;
  s.books.reserved(address, bytes, segment.stream, segment.small, current_tag_id());
  return true;
}

// Maps the start of `hole` so that, with the free blocks before and after it, a free block of
// `rounded` bytes forms; returns it out of the pool, or nullptr when the hole has no room or
// the memory is not there.
inline Block* map_into_hole(PoolState& s, ExpandableSegment& segment, Block* hole, std::size_t rounded) {
  Block* before = hole->prev != nullptr && hole->prev->is_free() ? hole->prev : nullptr;
  Block* after = hole->next != nullptr && hole->next->is_free() ? hole->next : nullptr;
  const std::size_t have = before != nullptr ? before->size : 0;
  // The block before alone would do but the pool did not hand it out (max_split_size):
  // mapping nothing changes that.
  if (have >= rounded) return nullptr;
  const std::size_t grow = std::min(hole->size, round_up(rounded - have, growth_step(s, segment.small)));
  const bool whole = grow == hole->size;
  if (have + grow + (whole && after != nullptr ? after->size : 0) < rounded) return nullptr;
  if (!map_pages(s, segment, hole->address, grow)) return nullptr;
  segment.holes.erase(hole->address);
  Block* block = hole;
  if (whole) {
    hole->mapped = true;
  } else {
    block = s.split_off_front(hole, grow);
    block->mapped = true;
    segment.holes.emplace(hole->address, hole);
  }
  s.merge(block, before);
  if (whole) s.merge(block, after);
  return block;
}

// Maps pages for `rounded` bytes and returns the free block holding them, out of the free
// pool: in the lowest hole that has room (with the free blocks on either side of it), else
// at the segment's end. nullptr when the cap, the reservation or the device has no room.
inline Block* grow_expandable(PoolState& s, std::size_t rounded, Stream stream, bool small) {
  ExpandableSegment* segment = s.expandable.of(stream, small, *s.backend, growth_step(s, small));
  if (segment == nullptr) return nullptr;
  for (const auto& [address, hole] : segment->holes) {
    if (Block* block = map_into_hole(s, *segment, hole, rounded)) return block;
  }
  Block* tail = segment->tail;
  // A free tail too small for the request grows; one the pool would not hand out
  // (max_split_size) stays as it is, with the new block after it.
  const bool extend_tail = tail != nullptr && tail->is_free() && tail->size < rounded;
  const std::size_t have = extend_tail ? tail->size : 0;
  const std::size_t grow = round_up(rounded - have, growth_step(s, small));
  if (grow > segment->room() || !map_pages(s, *segment, segment->base + segment->extent, grow)) {
    return nullptr;
  }
  if (segment->extent == 0) s.books.segment_opened(small, false);
  const std::uintptr_t end = segment->base + segment->extent;
  segment->extent += grow;
  if (extend_tail) {
    s.erase_free(tail);
    tail->size += grow;
    return tail;
  }
  Block* block = s.new_block();
  block->address = end;
  block->size = grow;
  block->stream = stream;
  block->small = small;
  block->expandable = segment;
  block->prev = tail;
  if (tail != nullptr) s.link_next(tail, block);
  else s.segments.emplace(block->address, block);
  segment->tail = block;
  return block;
}

inline Block* new_segment(PoolState& s, std::size_t size, Stream stream, bool small) {
  if (exceeds_reserved_cap(s.books.reserved_bytes(), s.reserved_limit, size)) {
    return nullptr;
  }
  void* ptr = s.backend->allocate(size);
  if (ptr == nullptr) return nullptr;
  Block* block = s.new_block();
  block->address = reinterpret_cast<std::uintptr_t>(ptr);
  block->size = size;
  block->stream = stream;
  block->small = small;
  s.segments.emplace(block->address, block);
  s.books.reserved(block->address, size, stream, small, current_tag_id());
  s.books.segment_opened(small, size >= s.config.max_split_size_bytes);
  return block;
}

// A block for `rounded` bytes from new device memory: a new fixed segment, or pages mapped in
// the stream's expandable segment (into a hole, else at its end).
inline Block* new_memory(PoolState& s, std::size_t rounded, Stream stream, bool small) {
  if (s.config.expandable_segments) return grow_expandable(s, rounded, stream, small);
  return new_segment(s, segment_size_for(rounded, s.config.large_segment_size_bytes), stream, small);
}

inline void release_segment(PoolState& s, Block* block) {
  s.backend->deallocate(reinterpret_cast<void*>(block->address), block->size);
  s.segments.erase(block->address);
  s.books.released(block->address, block->size, block->stream, block->small);
  s.books.segment_closed(block->small, block->size >= s.config.max_split_size_bytes);
  s.recycle(block);
}

// Unmaps the whole granules inside a free block of an expandable segment: they become a hole
// (merged with holes beside it), or, at the segment's end, leave the segment, whose
// reservation goes back once nothing of it is left. Returns the bytes unmapped.
inline std::size_t unmap_free_pages(PoolState& s, Block* block) {
  ExpandableSegment& segment = *block->expandable;
  const std::uintptr_t begin = block->address;
  const std::uintptr_t end = begin + block->size;
  const auto [low, high] = segment.whole_granules(*block, s.backend->granularity());
  if (low >= high) return 0;
  const std::size_t unmapped = high - low;
  s.erase_free(block);
  s.backend->unmap(reinterpret_cast<void*>(low), unmapped);
  s.books.released(low, unmapped, segment.stream, segment.small);
  segment.mapped -= unmapped;
  // The pieces of granules that stay mapped on either side stay free blocks.
  if (low > begin) s.insert_free(s.split_off_front(block, low - begin));
  if (high < end) s.insert_free(s.split_off_back(block, end - high));
  Block* hole = block;
  hole->mapped = false;
  if (hole->prev != nullptr && !hole->prev->mapped) s.absorb_hole(hole, hole->prev);
  if (hole->next != nullptr && !hole->next->mapped) s.absorb_hole(hole, hole->next);
  if (hole != segment.tail) {
    segment.holes.emplace(hole->address, hole);
    return unmapped;
  }
  segment.tail = hole->prev;
  segment.extent = hole->address - segment.base;
  if (hole->prev != nullptr) s.link_next(hole->prev, nullptr);
  else s.segments.erase(hole->address);
  s.recycle(hole);
  if (segment.extent == 0) {
    s.books.segment_closed(segment.small, false);
    s.expandable.release(segment, *s.backend);
  }
  return unmapped;
}

}  // namespace remat::alloc::detail
