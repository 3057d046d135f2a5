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
    stats_.allocations.add(1);
    TagStats& per_tag = stats_for(block.tag);
    per_tag.bytes.add(bytes);
    per_tag.requested_bytes.add(requested);
    per_tag.count.add(1);
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
    TagStats& per_tag = tag_stats_[block.tag];
    per_tag.bytes.subtract(bytes);
    per_tag.requested_bytes.subtract(requested);
    per_tag.count.subtract(1);
    if (now) {
      trace_.record_immediate_free(block.address, block.size, block.stream, block.tag);
      stats_.active_bytes.subtract(bytes);
    } else {
      trace_.record(TraceAction::free_requested, block.address, block.size, block.stream, block.tag);
    }
  }

  // The streams that used a freed block are done with it.
  void free_completed(const Block& block) {
    trace_.record(TraceAction::free_completed, block.address, block.size, block.stream, block.tag);
    stats_.active_bytes.subtract(static_cast<std::int64_t>(block.size));
  }

  // `bytes` of device memory at `address` reserved (a fixed segment, or pages mapped into an
  // expandable one) while `tag` was in force.
  void reserved(std::uintptr_t address, std::size_t bytes, Stream stream, TagId tag) {
    stats_.reserved_bytes.add(static_cast<std::int64_t>(bytes));
    trace_.record(TraceAction::segment_alloc, address, bytes, stream, tag);
  }

  // `bytes` at `address` given back to the backend.
  void released(std::uintptr_t address, std::size_t bytes, Stream stream) {
    stats_.reserved_bytes.subtract(static_cast<std::int64_t>(bytes));
    trace_.record(TraceAction::segment_free, address, bytes, stream, 0);
  }

  // A segment appeared or went away (a fixed one, or an expandable one's first or last pages).
  void segment_opened() { stats_.segments.add(1); }
  void segment_closed() { stats_.segments.subtract(1); }

  // The pool found no memory the first time and retries after giving its cache back.
  void retried() { ++stats_.num_alloc_retries; }

  // A request for `requested` bytes (`rounded` in the pool) failed.
  void out_of_memory(std::size_t rounded, std::size_t requested, Stream stream, TagId tag) {
    ++stats_.num_ooms;
    trace_.record_request(TraceAction::oom, 0, rounded, requested, stream, tag);
  }
  // A request larger than any device failed before reaching the pool.
  void impossible_request() { ++stats_.num_ooms; }
  void invalid_free() { ++stats_.num_invalid_frees; }

  void reset_peaks() {
    for (Stat* stat : {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.active_bytes,
                       &stats_.reserved_bytes, &stats_.allocations, &stats_.segments}) {
      stat->reset_peak();
    }
    for (TagStats& per_tag : tag_stats_) {
      per_tag.bytes.reset_peak();
      per_tag.requested_bytes.reset_peak();
      per_tag.count.reset_peak();
    }
  }

  // Capacity in records; 0 switches the trace off. Clears it.
  void resize_trace(std::size_t entries) { trace_.resize(entries); }

  const AllocatorStats& stats() const { return stats_; }
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
  TagStats& stats_for(TagId tag) {
    if (tag >= tag_stats_.size()) tag_stats_.resize(static_cast<std::size_t>(tag) + 1);
    return tag_stats_[tag];
  }

  AllocatorStats stats_;
  std::vector<TagStats> tag_stats_;
  TraceRing trace_;
};

}  // namespace remat::alloc::detail
