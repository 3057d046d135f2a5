#pragma once
// A piece of a segment. Blocks of one segment form an address-ordered list via prev/next;
// free small-pool blocks also sit on a size-bin list via bin_prev/bin_next.

#include <remat/alloc/backend.hpp>
#include <remat/alloc/tags.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace remat::alloc::detail {

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
  int pending_events = 0;
  TagId tag = 0;
  bool allocated = false;
  bool small = false;

  bool is_free() const { return !allocated && pending_events == 0; }
  bool is_whole_segment() const { return prev == nullptr && next == nullptr; }
};

}  // namespace remat::alloc::detail
