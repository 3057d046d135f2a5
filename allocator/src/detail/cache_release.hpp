#pragma once
// Cached memory given back to the backend: all of it the pool holds free (empty_cache, the retry
// before out-of-memory, a backend switched, shutdown), or, past PyTorch's
// garbage_collection_threshold, what has been idle longest. Read and changed under the pool's
// lock; nothing on the cached pair's path calls it.

#include "pool_state.hpp"
#include "segment_memory.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace remat::alloc::detail {

// Every whole free fixed segment, and every whole free granule of the expandable segments,
// wherever it lies.
inline void release_cached_blocks(PoolState& s) {
  std::vector<Block*> whole;
  std::vector<Block*> in_expandable;
  auto consider = [&](Block* block) {
    if (block->is_whole_segment()) whole.push_back(block);
    else if (block->expandable != nullptr) in_expandable.push_back(block);
  };
  s.small_pool.for_each(consider);
  s.large_pool.for_each(consider);
  for (Block* block : whole) {
    s.erase_free(block);
    release_segment(s, block);
  }
  // Unmapping one block changes only it and the holes beside it, so the others stay valid.
  for (Block* block : in_expandable) unmap_free_pages(s, block);
}

// PyTorch's garbage_collection_threshold: with a memory_fraction cap, once reserved bytes pass
// the threshold's share of it, gives back the cached memory idle longest (whole free segments,
// expandable segments' free granules) until reserved is under the threshold again.
inline void collect_garbage(PoolState& s) {
  if (s.config.garbage_collection_threshold <= 0.0 || s.reserved_limit == Config::kUnlimited) return;
  const auto threshold = static_cast<std::size_t>(s.config.garbage_collection_threshold *
                                                  static_cast<double>(s.reserved_limit));
  if (s.books.reserved_bytes() <= threshold) return;
  std::vector<Block*> idle;
  auto consider = [&](Block* block) {
    if (block->is_whole_segment() || block->expandable != nullptr) idle.push_back(block);
  };
  s.small_pool.for_each(consider);
  s.large_pool.for_each(consider);
  std::sort(idle.begin(), idle.end(), [](const Block* a, const Block* b) { return a->freed_at < b->freed_at; });
  for (Block* block : idle) {
    if (s.books.reserved_bytes() <= threshold) break;
    if (block->expandable != nullptr) {
      unmap_free_pages(s, block);
    } else {
      s.erase_free(block);
      release_segment(s, block);
    }
  }
}

}  // namespace remat::alloc::detail
