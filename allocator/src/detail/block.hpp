#pragma once
// A piece of a segment. Blocks of one segment form an address-ordered list via prev/next;
// free small-pool blocks also sit on a size-bin list via bin_prev/bin_next.

#include <remat/alloc/backend.hpp>
#include <remat/alloc/tags.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace remat::alloc::detail {

struct Block;

struct ExpandableSegment;  // expandable_segments.hpp

struct Block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  Stream stream = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  Block* bin_prev = nullptr;
  Block* bin_next = nullptr;
  std::vector<Stream> stream_uses;  // other streams the block was used on (record_stream)
  ExpandableSegment* expandable = nullptr;  // the expandable segment it lies in, if any
  std::uint64_t freed_at = 0;               // when it last became free (a counter), for GC
  int pending_events = 0;
  TagId tag = 0;
  bool allocated = false;
  bool small = false;
  bool oversize = false;  // allocated at max_split_size or more (counted as PyTorch counts it)
  bool mapped = true;  // false: a hole of an expandable segment, in no free pool

  bool is_free() const { return mapped && !allocated && pending_events == 0; }
  // A free block that is a whole fixed segment can go back to the backend as it is.
  bool is_whole_segment() const { return prev == nullptr && next == nullptr && expandable == nullptr; }
};

}  // namespace remat::alloc::detail
