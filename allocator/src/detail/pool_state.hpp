#pragma once
// The caching pool's state and its block mechanics: free pools, the segments' address-ordered
// block lists, splitting and merging. Beside it, each its own idea: frees waiting on stream events
// (pending_frees.hpp, a type the state holds), and functions over the state that
// caching_allocator.cpp applies: memory from the backend, fixed segments and expandable ones'
// pages (segment_memory.hpp; their address space is expandable_segments.hpp's), giving cached
// memory back (cache_release.hpp), what the pool tells when something went wrong
// (pool_diagnostics.hpp).
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
