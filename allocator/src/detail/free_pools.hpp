#pragma once
// The two pools of free blocks. Both answer "smallest free block of this stream that fits".
// Small pool: blocks are at most one 2 MiB segment, so an exact-size bin per 512 B with a
// two-level bitmap finds the best fit in O(1) and unlinks in O(1): the hot path of
// training allocates and frees small and mid-sized tensors all the time. Large pool: an
// ordered set by (stream, size, address), like PyTorch's.

#include "block.hpp"

#include <remat/alloc/size_classes.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <memory>
#include <memory_resource>
#include <set>
#include <utility>
#include <vector>

namespace remat::alloc::detail {

class SmallPool {
 public:
  [[gnu::always_inline]] void insert(Block* block) { bins_for(block->stream).insert(block); }
  [[gnu::always_inline]] void erase(Block* block) { bins_for(block->stream).erase(block); }

  // Removes and returns the smallest free block of `stream` holding `size` bytes.
  [[gnu::always_inline]] Block* take_best_fit(Stream stream, std::size_t size) {
    Bins* bins = find(stream);
    if (bins == nullptr) return nullptr;
    Block* block = bins->best_fit(size);
    if (block != nullptr) bins->erase(block);
    return block;
  }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const auto& [stream, bins] : streams_) bins->for_each(fn);
  }

 private:
  class Bins {
   public:
    static constexpr std::size_t kCount = kSmallSegmentSize / kMinBlockSize;  // 4096 sizes

    [[gnu::always_inline]] void insert(Block* block) {
      const std::size_t bin = index(block->size);
      block->bin_prev = nullptr;
      block->bin_next = heads_[bin];
      if (heads_[bin] != nullptr) heads_[bin]->bin_prev = block;
      heads_[bin] = block;
      words_[bin / 64] |= std::uint64_t{1} << (bin % 64);
      summary_ |= std::uint64_t{1} << (bin / 64);
    }

    [[gnu::always_inline]] void erase(Block* block) {
      const std::size_t bin = index(block->size);
      if (block->bin_prev != nullptr) block->bin_prev->bin_next = block->bin_next;
      else heads_[bin] = block->bin_next;
      if (block->bin_next != nullptr) block->bin_next->bin_prev = block->bin_prev;
      block->bin_prev = block->bin_next = nullptr;
      if (heads_[bin] == nullptr) {
        words_[bin / 64] &= ~(std::uint64_t{1} << (bin % 64));
        if (words_[bin / 64] == 0) summary_ &= ~(std::uint64_t{1} << (bin / 64));
      }
    }

    Block* best_fit(std::size_t size) const {
      const std::size_t bin = index(size);
      std::size_t word = bin / 64;
      const std::uint64_t here = words_[word] & (~std::uint64_t{0} << (bin % 64));
      if (here != 0) return heads_[word * 64 + static_cast<std::size_t>(std::countr_zero(here))];
      const std::uint64_t later = word + 1 < 64 ? summary_ & (~std::uint64_t{0} << (word + 1)) : 0;
      if (later == 0) return nullptr;
      word = static_cast<std::size_t>(std::countr_zero(later));
      return heads_[word * 64 + static_cast<std::size_t>(std::countr_zero(words_[word]))];
    }

    template <typename Fn>
    void for_each(Fn&& fn) const {
      for (Block* head : heads_) {
        for (Block* block = head; block != nullptr; block = block->bin_next) fn(block);
      }
    }

   private:
    // Blocks of expandable segments can outgrow 2 MiB; they share the last bin, where any
    // block holds any small request.
    static std::size_t index(std::size_t size) { return std::min(size / kMinBlockSize, kCount) - 1; }

    std::array<Block*, kCount> heads_{};
    std::array<std::uint64_t, kCount / 64> words_{};
    std::uint64_t summary_ = 0;
  };

  [[gnu::always_inline]] Bins* find(Stream stream) {
    for (auto& [s, bins] : streams_) {
      if (s == stream) return bins.get();
    }
    return nullptr;
  }
  // Looked up three times per cached pair: the search inline, a stream's first bins out of line.
  [[gnu::always_inline]] Bins& bins_for(Stream stream) {
    if (Bins* bins = find(stream)) return *bins;
    return add_bins(stream);
  }
  [[gnu::noinline]] Bins& add_bins(Stream stream) {
    return *streams_.emplace_back(stream, std::make_unique<Bins>()).second;
  }

  std::vector<std::pair<Stream, std::unique_ptr<Bins>>> streams_;
};

class LargePool {
 public:
  void insert(Block* block) { blocks_.insert(block); }
  void erase(Block* block) { blocks_.erase(block); }

  // Removes and returns the smallest free block of `stream` holding `size` bytes, keeping
  // to max_split_size: oversized blocks are not handed to requests below it, nor to
  // requests they exceed by max_non_split_rounding or more.
  Block* take_best_fit(Stream stream, std::size_t size, std::size_t max_split, std::size_t max_non_split_rounding) {
    Block probe;
    probe.stream = stream;
    probe.size = size;
    const auto it = blocks_.lower_bound(&probe);
    if (it == blocks_.end() || (*it)->stream != stream) return nullptr;
    Block* block = *it;
    if (max_split != Config::kUnlimited) {
      if (size < max_split && block->size >= max_split) return nullptr;
      if (size >= max_split && block->size >= size + max_non_split_rounding) return nullptr;
    }
    blocks_.erase(it);
    return block;
  }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (Block* block : blocks_) fn(block);
  }

 private:
  struct Order {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->address < b->address;
    }
  };
  // Nodes come from a pool so that moving blocks in and out does not call malloc.
  std::pmr::unsynchronized_pool_resource nodes_;
  std::pmr::set<Block*, Order> blocks_{&nodes_};
};

}  // namespace remat::alloc::detail
