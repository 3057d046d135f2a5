#pragma once
// The pool's books: the whole-device statistics, the statistics per tag and the trace, kept in
// step. The pool calls one method per thing that happens to its memory (a block handed out, a
// block freed, a deferred free completed, memory reserved or given back, a failed request);
// every figure and trace event follows from those calls. Not thread-safe: the pool's lock
// covers it. allocated and freed run on every allocation: they are forced inline, which
// GCC's -O2 would not do for `allocated` on its own (a measured 5% on the traced pair).

#include <remat/alloc/allocator_snapshot.hpp>
#include <remat/alloc/stats.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/alloc/trace.hpp>

#include "block.hpp"

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace remat::alloc::detail {

class Ledger {
 public:
  explicit Ledger(std::size_t trace_entries) : trace_(trace_entries) {}

  // `block` was handed out for a request of `block.requested` bytes.
  [[gnu::always_inline]] void allocated(const Block& block) {
    const auto bytes = static_cast<std::int64_t>(block.size);
    const auto requested = static_cast<std::int64_t>(block.requested);
    stats_.allocated_bytes.add(bytes);
    stats_.active_bytes.add(bytes);
    stats_.requested_bytes.add(requested);
    if (stats_.requested_bytes.current > requested_window_peak_) requested_window_peak_ = stats_.requested_bytes.current;
    stats_.allocations.add(1);
    stats_.active_blocks.add(1);
    if (block.small) {
      small_peaks_.rise(stats_.allocated_bytes, large_.allocated_bytes, &PoolPeaks::allocated_bytes);
      small_peaks_.rise(stats_.active_bytes, large_.active_bytes, &PoolPeaks::active_bytes);
      small_peaks_.rise(stats_.requested_bytes, large_.requested_bytes, &PoolPeaks::requested_bytes);
      small_peaks_.rise(stats_.allocations, large_.allocations, &PoolPeaks::allocations);
      small_peaks_.rise(stats_.active_blocks, large_.active_blocks, &PoolPeaks::active_blocks);
    } else {
      large_.allocated_bytes.add(bytes);
      large_.active_bytes.add(bytes);
      large_.requested_bytes.add(requested);
      large_.allocations.add(1);
      large_.active_blocks.add(1);
    }
    if (block.oversize) stats_.oversize_allocations.add(1);
    TagStats& per_tag = stats_for(block.tag);
    per_tag.bytes.add(bytes);
    per_tag.requested_bytes.add(requested);
    per_tag.count.add(1);
    const auto category = static_cast<std::size_t>(tag_category_[block.tag]);
    stats_.category_bytes[category] += bytes;
    stats_.category_requested_bytes[category] += requested;
    // A new peak only: a pair that returns to the same peak keeps the breakdown taken there.
    if (stats_.allocated_bytes.current > category_peak_at_) note_category_peak();
    trace_.record_request(TraceAction::alloc, block.address, block.size, block.requested, block.stream, block.tag);
  }

  // Its owner freed `block`. With `now` no other stream uses it and it is free at once;
  // otherwise it stays active until free_completed.
  [[gnu::always_inline]] void freed(const Block& block, bool now) {
    const auto bytes = static_cast<std::int64_t>(block.size);
    const auto requested = static_cast<std::int64_t>(block.requested);
    stats_.allocated_bytes.subtract(bytes);
    stats_.requested_bytes.subtract(requested);
    stats_.allocations.subtract(1);
    if (!block.small) {
      large_.allocated_bytes.subtract(bytes);
      large_.requested_bytes.subtract(requested);
      large_.allocations.subtract(1);
    }
    if (block.oversize) stats_.oversize_allocations.subtract(1);
    TagStats& per_tag = tag_stats_[block.tag];
    per_tag.bytes.subtract(bytes);
    per_tag.requested_bytes.subtract(requested);
    per_tag.count.subtract(1);
    const auto category = static_cast<std::size_t>(tag_category_[block.tag]);
    stats_.category_bytes[category] -= bytes;
    stats_.category_requested_bytes[category] -= requested;
    if (now) {
      trace_.record_immediate_free(block.address, block.size, block.stream, block.tag);
      no_longer_active(block);
    } else {
      trace_.record(TraceAction::free_requested, block.address, block.size, block.stream, block.tag);
    }
  }

  // The live `block` now belongs to `tag`: its bytes leave its old tag's statistics for the new
  // one's, and a retag event tells trace readers so (earlier events keep the tag they had).
  void retagged(Block& block, TagId tag) {
    const auto bytes = static_cast<std::int64_t>(block.size);
    const auto requested = static_cast<std::int64_t>(block.requested);
    TagStats& from = stats_for(block.tag);
    from.bytes.subtract(bytes);
    from.requested_bytes.subtract(requested);
    from.count.subtract(1);
    auto category = static_cast<std::size_t>(tag_category_[block.tag]);
    stats_.category_bytes[category] -= bytes;
    stats_.category_requested_bytes[category] -= requested;
    block.tag = tag;
    TagStats& to = stats_for(tag);
    to.bytes.add(bytes);
    to.requested_bytes.add(requested);
    to.count.add(1);
    category = static_cast<std::size_t>(tag_category_[tag]);
    stats_.category_bytes[category] += bytes;
    stats_.category_requested_bytes[category] += requested;
    trace_.record_request(TraceAction::retag, block.address, block.size, block.requested, block.stream, tag);
  }

  // The streams that used a freed block are done with it.
  void free_completed(const Block& block) {
    trace_.record(TraceAction::free_completed, block.address, block.size, block.stream, block.tag);
    no_longer_active(block);
  }

  // A free block entered or left its pool. One that shares its segment with other blocks is
  // inactive split memory; the pool tells the books before and after relinking a pooled block.
  [[gnu::always_inline]] void pooled(const Block& block) {
    if (block.prev == nullptr && block.next == nullptr) return;
    const auto bytes = static_cast<std::int64_t>(block.size);
    stats_.inactive_split.add(1);
    stats_.inactive_split_bytes.add(bytes);
    if (block.small) {
      small_peaks_.rise(stats_.inactive_split, large_.inactive_split, &PoolPeaks::inactive_split);
      small_peaks_.rise(stats_.inactive_split_bytes, large_.inactive_split_bytes, &PoolPeaks::inactive_split_bytes);
    } else {
      large_.inactive_split.add(1);
      large_.inactive_split_bytes.add(bytes);
    }
  }
  [[gnu::always_inline]] void unpooled(const Block& block) {
    if (block.prev == nullptr && block.next == nullptr) return;
    const auto bytes = static_cast<std::int64_t>(block.size);
    stats_.inactive_split.subtract(1);
    stats_.inactive_split_bytes.subtract(bytes);
    if (!block.small) {
      large_.inactive_split.subtract(1);
      large_.inactive_split_bytes.subtract(bytes);
    }
  }

  // `bytes` of device memory at `address` reserved for a pool (a fixed segment, or pages
  // mapped into an expandable one) while `tag` was in force.
  void reserved(std::uintptr_t address, std::size_t bytes, Stream stream, bool small, TagId tag) {
    stats_.reserved_bytes.add(static_cast<std::int64_t>(bytes));
    if (small) small_peaks_.rise(stats_.reserved_bytes, large_.reserved_bytes, &PoolPeaks::reserved_bytes);
    else large_.reserved_bytes.add(static_cast<std::int64_t>(bytes));
    trace_.record(TraceAction::segment_alloc, address, bytes, stream, tag);
  }

  // `bytes` at `address` given back to the backend.
  void released(std::uintptr_t address, std::size_t bytes, Stream stream, bool small) {
    stats_.reserved_bytes.subtract(static_cast<std::int64_t>(bytes));
    if (!small) large_.reserved_bytes.subtract(static_cast<std::int64_t>(bytes));
    trace_.record(TraceAction::segment_free, address, bytes, stream, 0);
  }

  // A segment appeared or went away (a fixed one, or an expandable one's first or last pages);
  // an oversize one is a fixed segment of at least max_split_size.
  void segment_opened(bool small, bool oversize) {
    stats_.segments.add(1);
    if (small) small_peaks_.rise(stats_.segments, large_.segments, &PoolPeaks::segments);
    else large_.segments.add(1);
    if (oversize) stats_.oversize_segments.add(1);
  }
  void segment_closed(bool small, bool oversize) {
    stats_.segments.subtract(1);
    if (!small) large_.segments.subtract(1);
    if (oversize) stats_.oversize_segments.subtract(1);
  }

  // The pool found no memory the first time and retries after giving its cache back.
  void retried() { ++stats_.num_alloc_retries; }
  // The pool waited for every stream's pending frees.
  void waited_for_all_streams() { ++stats_.num_sync_all_streams; }

  // A request for `requested` bytes (`rounded` in the pool) failed.
  void out_of_memory(std::size_t rounded, std::size_t requested, Stream stream, TagId tag) {
    ++stats_.num_ooms;
    trace_.record_request(TraceAction::oom, 0, rounded, requested, stream, tag);
  }
  // A request larger than any device failed before reaching the pool.
  void impossible_request() { ++stats_.num_ooms; }
  void invalid_free() { ++stats_.num_invalid_frees; }

  void reset_peaks() {
    for_each_stat([](Stat& stat) { stat.reset_peak(); });
    note_category_peak();
    small_peaks_ = PoolPeaks::of(small_pool());
    for (TagStats& per_tag : tag_stats_) {
      per_tag.bytes.reset_peak();
      per_tag.requested_bytes.reset_peak();
      per_tag.count.reset_peak();
    }
  }

  // The most requested bytes held since the last call (or since the pool began), and a new window
  // from now: a peak over a stretch of a step that leaves the peak statistics, which belong to
  // the user (reset_peaks, PyTorch's reset_peak_memory_stats), alone.
  std::int64_t take_requested_window_peak() {
    const std::int64_t peak = std::max(requested_window_peak_, stats_.requested_bytes.current);
    requested_window_peak_ = stats_.requested_bytes.current;
    return peak;
  }

  // PyTorch's resetAccumulatedStats: the cumulative totals and the event counts start again;
  // what is current (and its peak) stays.
  void reset_accumulated() {
    for_each_stat([](Stat& stat) { stat.reset_accumulated(); });
    stats_.num_ooms = 0;
    stats_.num_alloc_retries = 0;
    stats_.num_sync_all_streams = 0;
  }

  // Capacity in records; 0 switches the trace off. Clears it.
  void resize_trace(std::size_t entries) { trace_.resize(entries); }

  // The whole device's figures and both pools': the large pool's are kept, the small pool's are
  // the whole device's less the large pool's, with their own peaks.
  AllocatorStats stats() const {
    AllocatorStats out = stats_;
    out.pools[static_cast<std::size_t>(PoolKind::large)] = large_;
    out.pools[static_cast<std::size_t>(PoolKind::small)] = small_pool();
    return out;
  }
  // The whole device's figures alone (their `pools` left empty), without a copy.
  const AllocatorStats& device_stats() const { return stats_; }
  std::size_t reserved_bytes() const { return static_cast<std::size_t>(stats_.reserved_bytes.current); }
  const std::vector<TagStats>& tag_stats() const { return tag_stats_; }  // indexed by TagId
  const TraceRing& trace() const { return trace_; }

  // The tags that ever allocated, with their statistics.
  std::vector<TagStatsEntry> tags_that_allocated() const {
    std::vector<TagStatsEntry> out;
    for (std::size_t tag = 0; tag < tag_stats_.size(); ++tag) {
      if (tag_stats_[tag].count.total_added != 0) out.push_back({static_cast<TagId>(tag), tag_stats_[tag]});
    }
    return out;
  }

  // The requested bytes live now under each tag that has any.
  std::vector<std::pair<TagId, std::int64_t>> live_requested_by_tag() const {
    std::vector<std::pair<TagId, std::int64_t>> out;
    for (std::size_t tag = 0; tag < tag_stats_.size(); ++tag) {
      const std::int64_t bytes = tag_stats_[tag].requested_bytes.current;
      if (bytes != 0) out.emplace_back(static_cast<TagId>(tag), bytes);
    }
    return out;
  }

 private:
  // The small pool's peaks: its figures are derived (whole less large), so on each small-pool
  // rise the derived current is compared with the peak, with no other write.
  struct PoolPeaks {
    std::int64_t allocated_bytes = 0, requested_bytes = 0, active_bytes = 0, reserved_bytes = 0,
                 inactive_split_bytes = 0, allocations = 0, active_blocks = 0, segments = 0, inactive_split = 0;

    [[gnu::always_inline]] void rise(const Stat& whole, const Stat& large, std::int64_t PoolPeaks::*peak) {
      const std::int64_t current = whole.current - large.current;
      if (current > this->*peak) this->*peak = current;
    }
    static PoolPeaks of(const PoolStats& pool) {
      return {pool.allocated_bytes.current, pool.requested_bytes.current, pool.active_bytes.current,
              pool.reserved_bytes.current,  pool.inactive_split_bytes.current, pool.allocations.current,
              pool.active_blocks.current,   pool.segments.current,           pool.inactive_split.current};
    }
  };

  [[gnu::always_inline]] void no_longer_active(const Block& block) {
    const auto bytes = static_cast<std::int64_t>(block.size);
    stats_.active_bytes.subtract(bytes);
    stats_.active_blocks.subtract(1);
    if (!block.small) {
      large_.active_bytes.subtract(bytes);
      large_.active_blocks.subtract(1);
    }
  }

  PoolStats small_pool() const {
    PoolStats out;
    auto derive = [](Stat& small, const Stat& whole, const Stat& large, std::int64_t peak) {
      small.current = whole.current - large.current;
      small.total_added = whole.total_added - large.total_added;
      small.current_at_reset = whole.current_at_reset - large.current_at_reset;
      small.peak = peak;
    };
    derive(out.allocated_bytes, stats_.allocated_bytes, large_.allocated_bytes, small_peaks_.allocated_bytes);
    derive(out.requested_bytes, stats_.requested_bytes, large_.requested_bytes, small_peaks_.requested_bytes);
    derive(out.active_bytes, stats_.active_bytes, large_.active_bytes, small_peaks_.active_bytes);
    derive(out.reserved_bytes, stats_.reserved_bytes, large_.reserved_bytes, small_peaks_.reserved_bytes);
    derive(out.inactive_split_bytes, stats_.inactive_split_bytes, large_.inactive_split_bytes,
           small_peaks_.inactive_split_bytes);
    derive(out.allocations, stats_.allocations, large_.allocations, small_peaks_.allocations);
    derive(out.active_blocks, stats_.active_blocks, large_.active_blocks, small_peaks_.active_blocks);
    derive(out.segments, stats_.segments, large_.segments, small_peaks_.segments);
    derive(out.inactive_split, stats_.inactive_split, large_.inactive_split, small_peaks_.inactive_split);
    return out;
  }

  template <typename Fn>
  void for_each_stat(Fn fn) {
    for (Stat* stat : {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.active_bytes, &stats_.reserved_bytes,
                       &stats_.allocations, &stats_.segments, &stats_.active_blocks, &stats_.inactive_split,
                       &stats_.inactive_split_bytes, &stats_.oversize_allocations, &stats_.oversize_segments,
                       &large_.allocated_bytes, &large_.requested_bytes, &large_.active_bytes, &large_.reserved_bytes,
                       &large_.inactive_split_bytes, &large_.allocations, &large_.active_blocks, &large_.segments,
                       &large_.inactive_split}) {
      fn(*stat);
    }
  }

  TagStats& stats_for(TagId tag) {
    if (tag >= tag_stats_.size()) grow_tag_tables(tag);
    return tag_stats_[tag];
  }
  // Tags never change once interned, so each tag's category is looked up once, off the hot path.
  [[gnu::noinline]] void grow_tag_tables(TagId tag) {
    const std::size_t known = tag_category_.size();
    tag_stats_.resize(static_cast<std::size_t>(tag) + 1);
    tag_category_.resize(static_cast<std::size_t>(tag) + 1);
    for (std::size_t id = known; id < tag_category_.size(); ++id) tag_category_[id] = tag_of(static_cast<TagId>(id)).category;
  }
  void note_category_peak() {
    category_peak_at_ = stats_.allocated_bytes.current;
    stats_.category_bytes_at_peak = stats_.category_bytes;
    stats_.category_requested_bytes_at_peak = stats_.category_requested_bytes;
  }

  AllocatorStats stats_;  // the whole device's figures (its pools are filled in by stats())
  PoolStats large_;
  PoolPeaks small_peaks_;
  std::vector<TagStats> tag_stats_;
  std::vector<Category> tag_category_;  // indexed by TagId, as tag_stats_
  std::int64_t category_peak_at_ = -1;   // allocated bytes when category_bytes_at_peak was taken
  std::int64_t requested_window_peak_ = 0;  // since take_requested_window_peak() last ran
  TraceRing trace_;
};

}  // namespace remat::alloc::detail
