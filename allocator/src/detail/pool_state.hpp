#pragma once
// The caching pool's state and its mechanics: free pools, segments fixed and expandable (whose
// address space expandable_segments.hpp owns) and the pages mapped in them, block splitting and
// merging. Frees waiting on stream events are pending_frees.hpp's; what gives cached memory back
// (empty_cache, garbage collection) is cache_release.hpp's, what the pool tells when something
// went wrong pool_diagnostics.hpp's.
// CachingAllocator (caching_allocator.cpp) locks it and turns its operations into the public API;
// the books (ledger.hpp) keep the statistics and the trace.

#include <remat/alloc/address_map.hpp>
#include <remat/alloc/backend.hpp>
#include <remat/alloc/config.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/size_classes.hpp>

#include "adaptive_mutex.hpp"
#include "block.hpp"
#include "expandable_segments.hpp"
#include "free_pools.hpp"
#include "ledger.hpp"
#include "oom_reporting.hpp"
#include "pending_frees.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace remat::alloc::detail {

inline std::size_t reserved_cap(Backend& backend, const Config& config) {
  if (config.memory_fraction >= 1.0) return Config::kUnlimited;
  return static_cast<std::size_t>(config.memory_fraction * static_cast<double>(backend.memory_info().total_bytes));
}

inline void check_backend_supports(const Backend& backend, const Config& config) {
  if (config.expandable_segments && backend.granularity() == 0) {
    throw ConfigError("expandable_segments:True needs a backend that maps memory into reserved address space; "
                      "the " + std::string(backend.name()) + " backend cannot: set expandable_segments:False");
  }
}

struct PoolState {
  PoolState(std::unique_ptr<Backend> b, const Config& c)
      : books(c.trace_entries), backend(std::move(b)), config(c), reserved_limit(reserved_cap(*backend, c)) {
    check_backend_supports(*backend, config);
  }

  mutable AdaptiveMutex mutex;
  Ledger books;  // first: the hot path's counters sit at short offsets from the state
  std::unique_ptr<Backend> backend;
  Config config;
  std::size_t reserved_limit;
  SmallPool small_pool;
  LargePool large_pool;
  AddressMap<Block*> live;  // allocated blocks by address
  std::map<std::uintptr_t, Block*> segments;  // head block of each segment by address
  PendingFrees pending_frees;
  Block* spare_blocks = nullptr;  // recycled block records, linked through `next`
  ExpandableSegments expandable;
  std::uint64_t frees = 0;                                      // stamps Block::freed_at
  OomHandler oom_handler;
  bool oom_reporting = true;
  OomDumpLimiter oom_dumps;

  [[gnu::always_inline]] void insert_free(Block* block) {
    if (block->small) small_pool.insert(block);
    else large_pool.insert(block);
    books.pooled(*block);
  }
  [[gnu::always_inline]] void erase_free(Block* block) {
    if (block->small) small_pool.erase(block);
    else large_pool.erase(block);
    books.unpooled(*block);
  }
  [[gnu::always_inline]] Block* take_free_block(bool small, Stream stream, std::size_t size) {
    Block* block = small ? small_pool.take_best_fit(stream, size)
                         : large_pool.take_best_fit(stream, size, config.max_split_size_bytes,
                                                    config.max_non_split_rounding_bytes);
    if (block != nullptr) books.unpooled(*block);
    return block;
  }
  // Sets `block`'s next neighbour; a pooled block is counted again, as it may now share its
  // segment or no longer do.
  void link_next(Block* block, Block* next) {
    const bool pooled = block->is_free();
    if (pooled) books.unpooled(*block);
    block->next = next;
    if (pooled) books.pooled(*block);
  }

  // Every cached pair splits a block and merges it back: the records are reused through a list
  // that needs no vector growth path in the hot code.
  [[gnu::always_inline]] Block* new_block() {
    if (spare_blocks == nullptr) return new Block();
    Block* block = std::exchange(spare_blocks, spare_blocks->next);
    *block = Block();
    return block;
  }
  [[gnu::always_inline]] void recycle(Block* block) {
    block->stream_uses.clear();
    block->next = std::exchange(spare_blocks, block);
  }

  Block* new_segment(std::size_t size, Stream stream, bool small) {
    if (exceeds_reserved_cap(books.reserved_bytes(), reserved_limit, size)) {
      return nullptr;
    }
    void* ptr = backend->allocate(size);
    if (ptr == nullptr) return nullptr;
    Block* block = new_block();
    block->address = reinterpret_cast<std::uintptr_t>(ptr);
    block->size = size;
    block->stream = stream;
    block->small = small;
    segments.emplace(block->address, block);
    books.reserved(block->address, size, stream, small, current_tag_id());
    books.segment_opened(small, size >= config.max_split_size_bytes);
    return block;
  }

  void release_segment(Block* block) {
    backend->deallocate(reinterpret_cast<void*>(block->address), block->size);
    segments.erase(block->address);
    books.released(block->address, block->size, block->stream, block->small);
    books.segment_closed(block->small, block->size >= config.max_split_size_bytes);
    recycle(block);
  }

  // A block for `rounded` bytes from new device memory: a new fixed segment, or pages mapped in
  // the stream's expandable segment (into a hole, else at its end).
  Block* new_memory(std::size_t rounded, Stream stream, bool small) {
    if (config.expandable_segments) return grow_expandable(rounded, stream, small);
    return new_segment(segment_size_for(rounded, config.large_segment_size_bytes), stream, small);
  }

  // One small or large segment, in whole granules of the backend.
  std::size_t growth_step(bool small) const {
    return std::lcm(small ? kSmallSegmentSize : config.large_segment_size_bytes, backend->granularity());
  }

  // Maps pages for `rounded` bytes and returns the free block holding them, out of the free
  // pool: in the lowest hole that has room (with the free blocks on either side of it), else
  // at the segment's end. nullptr when the cap, the reservation or the device has no room.
  Block* grow_expandable(std::size_t rounded, Stream stream, bool small) {
    ExpandableSegment* segment = expandable.of(stream, small, *backend, growth_step(small));
    if (segment == nullptr) return nullptr;
    for (const auto& [address, hole] : segment->holes) {
      if (Block* block = map_into_hole(*segment, hole, rounded)) return block;
    }
    Block* tail = segment->tail;
    // A free tail too small for the request grows; one the pool would not hand out
    // (max_split_size) stays as it is, with the new block after it.
    const bool extend_tail = tail != nullptr && tail->is_free() && tail->size < rounded;
    const std::size_t have = extend_tail ? tail->size : 0;
    const std::size_t grow = round_up(rounded - have, growth_step(small));
    if (grow > segment->room() || !map_pages(*segment, segment->base + segment->extent, grow)) {
      return nullptr;
    }
    if (segment->extent == 0) books.segment_opened(small, false);
    const std::uintptr_t end = segment->base + segment->extent;
    segment->extent += grow;
    if (extend_tail) {
      erase_free(tail);
      tail->size += grow;
      return tail;
    }
    Block* block = new_block();
    block->address = end;
    block->size = grow;
    block->stream = stream;
    block->small = small;
    block->expandable = segment;
    block->prev = tail;
    if (tail != nullptr) link_next(tail, block);
    else segments.emplace(block->address, block);
    segment->tail = block;
    return block;
  }

  // Maps `bytes` at `address` of the segment and counts them; false when the cap or the device
  // has no room.
  bool map_pages(ExpandableSegment& segment, std::uintptr_t address, std::size_t bytes) {
    if (exceeds_reserved_cap(books.reserved_bytes(), reserved_limit, bytes) ||
        !backend->map(reinterpret_cast<void*>(address), bytes)) {
      return false;
    }
    segment.mapped += bytes;
    books.reserved(address, bytes, segment.stream, segment.small, current_tag_id());
    return true;
  }

  // Maps the start of `hole` so that, with the free blocks before and after it, a free block of
  // `rounded` bytes forms; returns it out of the pool, or nullptr when the hole has no room or
  // the memory is not there.
  Block* map_into_hole(ExpandableSegment& segment, Block* hole, std::size_t rounded) {
    Block* before = hole->prev != nullptr && hole->prev->is_free() ? hole->prev : nullptr;
    Block* after = hole->next != nullptr && hole->next->is_free() ? hole->next : nullptr;
    const std::size_t have = before != nullptr ? before->size : 0;
    // The block before alone would do but the pool did not hand it out (max_split_size):
    // mapping nothing changes that.
    if (have >= rounded) return nullptr;
    const std::size_t grow = std::min(hole->size, round_up(rounded - have, growth_step(segment.small)));
    const bool whole = grow == hole->size;
    if (have + grow + (whole && after != nullptr ? after->size : 0) < rounded) return nullptr;
    if (!map_pages(segment, hole->address, grow)) return nullptr;
    segment.holes.erase(hole->address);
    Block* block = hole;
    if (whole) {
      hole->mapped = true;
    } else {
      block = split_off_front(hole, grow);
      block->mapped = true;
      segment.holes.emplace(hole->address, hole);
    }
    merge(block, before);
    if (whole) merge(block, after);
    return block;
  }

  // Unmaps the whole granules inside a free block of an expandable segment: they become a hole
  // (merged with holes beside it), or, at the segment's end, leave the segment, whose
  // reservation goes back once nothing of it is left. Returns the bytes unmapped.
  std::size_t unmap_free_pages(Block* block) {
    ExpandableSegment& segment = *block->expandable;
    const std::uintptr_t begin = block->address;
    const std::uintptr_t end = begin + block->size;
    const auto [low, high] = segment.whole_granules(*block, backend->granularity());
    if (low >= high) return 0;
    const std::size_t unmapped = high - low;
    erase_free(block);
    backend->unmap(reinterpret_cast<void*>(low), unmapped);
    books.released(low, unmapped, segment.stream, segment.small);
    segment.mapped -= unmapped;
    // The pieces of granules that stay mapped on either side stay free blocks.
    if (low > begin) insert_free(split_off_front(block, low - begin));
    if (high < end) insert_free(split_off_back(block, end - high));
    Block* hole = block;
    hole->mapped = false;
    if (hole->prev != nullptr && !hole->prev->mapped) absorb_hole(hole, hole->prev);
    if (hole->next != nullptr && !hole->next->mapped) absorb_hole(hole, hole->next);
    if (hole != segment.tail) {
      segment.holes.emplace(hole->address, hole);
      return unmapped;
    }
    segment.tail = hole->prev;
    segment.extent = hole->address - segment.base;
    if (hole->prev != nullptr) link_next(hole->prev, nullptr);
    else segments.erase(hole->address);
    recycle(hole);
    if (segment.extent == 0) {
      books.segment_closed(segment.small, false);
      expandable.release(segment, *backend);
    }
    return unmapped;
  }


  // The allocated block at `address`, or nullptr.
  Block* live_block(std::uintptr_t address) const {
    Block* const* found = live.find(address);
    return found != nullptr ? *found : nullptr;
  }

  // The block of a segment that holds `address`, or nullptr.
  Block* block_holding(std::uintptr_t address) const {
    auto it = segments.upper_bound(address);
    if (it == segments.begin()) return nullptr;
    for (Block* block = std::prev(it)->second; block != nullptr; block = block->next) {
      if (address >= block->address && address - block->address < block->size) return block;
    }
    return nullptr;
  }

  // A new, unlinked block of the same segment, stream and pool as `block`.
  [[gnu::always_inline]] Block* new_block_beside(const Block& block) {
    Block* other = new_block();
    other->stream = block.stream;
    other->small = block.small;
    other->expandable = block.expandable;
    other->freed_at = block.freed_at;
    return other;
  }

  // A new block for the first `bytes` of `block`, which keeps the rest; the new one is free.
  Block* split_off_front(Block* block, std::size_t bytes) {
    Block* front = new_block_beside(*block);
    front->address = block->address;
    front->size = bytes;
    front->prev = block->prev;
    front->next = block;
    if (front->prev != nullptr) front->prev->next = front;
    else segments[front->address] = front;
    block->prev = front;
    block->address += bytes;
    block->size -= bytes;
    return front;
  }

  // A new block for the last `bytes` of `block`, which keeps the rest; the new one is free.
  [[gnu::always_inline]] Block* split_off_back(Block* block, std::size_t bytes) {
    Block* back = new_block_beside(*block);
    back->size = bytes;
    block->size -= bytes;
    back->address = block->address + block->size;
    back->prev = block;
    back->next = block->next;
    if (back->next != nullptr) back->next->prev = back;
    else if (back->expandable != nullptr) back->expandable->tail = back;
    block->next = back;
    return back;
  }

  // `hole` takes in the hole beside it.
  void absorb_hole(Block* hole, Block* neighbour) {
    hole->expandable->holes.erase(neighbour->address);
    absorb(hole, neighbour);
  }

  // The block list's one splice for a merge: `block` takes in `neighbour` (its prev or its
  // next), whose record goes back to the spares; the segment's head, or an expandable
  // segment's tail, follows.
  [[gnu::always_inline]] void absorb(Block* block, Block* neighbour) {
    if (neighbour == block->prev) {
      block->address = neighbour->address;
      block->prev = neighbour->prev;
      if (block->prev != nullptr) block->prev->next = block;
      else segments[block->address] = block;
    } else {
      block->next = neighbour->next;
      if (block->next != nullptr) block->next->prev = block;
      else if (block->expandable != nullptr) block->expandable->tail = block;
    }
    block->size += neighbour->size;
    recycle(neighbour);
  }

  [[gnu::always_inline]] void split(Block* block, std::size_t size) {
    const std::size_t remaining = block->size - size;
    // As PyTorch: expandable segments split any remainder, like the small pool.
    const bool worth_splitting = block->small || block->expandable != nullptr
                                     ? remaining >= kMinBlockSize
                                     : size < config.max_split_size_bytes && remaining > kSmallRequestLimit;
    if (!worth_splitting) return;
    Block* rest = split_off_back(block, remaining);
    rest->freed_at = ++frees;
    insert_free(rest);
  }

  // Absorbs `neighbour` into `block` when it is free.
  [[gnu::always_inline]] void merge(Block* block, Block* neighbour) {
    if (neighbour == nullptr || !neighbour->is_free()) return;
    erase_free(neighbour);
    absorb(block, neighbour);
  }

  // The block is no longer used by anyone (the books already know): return it to its pool.
  [[gnu::always_inline]] void complete_free(Block* block) {
    block->requested = 0;
    block->tag = 0;
    merge(block, block->prev);
    merge(block, block->next);
    block->freed_at = ++frees;
    insert_free(block);
  }

  // Retires the frees whose stream events completed (with `wait`, waits for each where the backend
  // can): a block none of whose events is left goes back to its pool.
  void process_pending_frees(bool wait) {
    if (wait) books.waited_for_all_streams();
    pending_frees.retire(*backend, wait, [this](Block* block) {
      books.free_completed(*block);
      complete_free(block);
    });
  }
};

}  // namespace remat::alloc::detail
