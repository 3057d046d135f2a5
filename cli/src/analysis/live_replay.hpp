#pragma once
// Replays allocator events into live bytes per group, with peaks.
//
// An allocation is live from its `alloc` event until its `free_requested` event, the point
// PyTorch's memory viewer treats as freed (the block may still be in use by another stream
// until `free_completed`, but the program has released it). A `free_completed` without a
// preceding `free_requested` also ends it. Frees of addresses allocated before the trace
// began (a ring buffer that dropped events) are counted as unmatched and change nothing.
// A `retag` moves a live allocation's bytes to the group of its new tag from then on (the
// total, and so the peak's time, does not change; the groups' split of later peaks does).
//
// Events come from a checked stream (reader/event_checks.hpp): in time order, no alloc at a
// live address, live and reserved bytes within 64 bits.

#include <remat/alloc/address_map.hpp>

#include "analysis/grouping.hpp"
#include "reader/trace_file.hpp"

#include <array>
#include <optional>
#include <vector>

namespace remat::report {

class LiveReplay : public EventSink {
 public:
  LiveReplay(const TagTable& tags, GroupBy by);

  void on_event(const Event& event) override { apply(event); }
  void apply(const Event& event);

  const std::vector<GroupLabel>& labels() const { return grouper_.labels(); }
  const std::vector<std::uint64_t>& live() const { return live_; }
  const std::vector<std::uint64_t>& peak() const { return peak_; }
  const std::vector<std::uint64_t>& live_count() const { return live_count_; }
  const std::vector<std::uint64_t>& allocations() const { return allocations_; }
  std::uint64_t total() const { return total_; }
  std::uint64_t peak_total() const { return peak_total_; }
  // When the total first reached its peak; empty when nothing was ever live.
  std::optional<std::int64_t> peak_time() const { return peak_time_; }
  // Each group's live bytes when the total first reached its peak: what the peak was made of.
  const std::vector<std::uint64_t>& live_at_peak() const { return live_at_peak_; }
  std::uint64_t reserved() const { return reserved_; }
  std::uint64_t peak_reserved() const { return peak_reserved_; }
  std::uint64_t events() const { return events_; }
  std::int64_t first_time() const { return first_time_; }
  std::int64_t last_time() const { return last_time_; }
  std::uint64_t unmatched_frees() const { return unmatched_frees_; }
  std::uint64_t action_count(Action action) const { return actions_[static_cast<std::size_t>(action)]; }

 private:
  struct LiveBlock {
    std::uint64_t size = 0;
    std::uint32_t group = 0;
  };
  void ensure(std::uint32_t group);
  void release(std::uint64_t address);
  void move(const Event& retag);
  // live_ changed for `group` since the last peak; at the next peak, its value is copied.
  void changed(std::uint32_t group);

  Grouper grouper_;
  alloc::AddressMap<LiveBlock> blocks_;
  std::vector<std::uint64_t> live_, peak_, live_count_, allocations_;
  // live_at_peak_ lags live_ only in the groups listed in changed_since_peak_ (copying just
  // those at each new peak keeps a replay linear in events, not events times groups).
  std::vector<std::uint64_t> live_at_peak_;
  std::vector<std::uint32_t> changed_since_peak_;
  std::vector<bool> is_changed_;
  std::uint64_t total_ = 0, peak_total_ = 0, reserved_ = 0, peak_reserved_ = 0, events_ = 0, unmatched_frees_ = 0;
  std::optional<std::int64_t> peak_time_;
  std::int64_t first_time_ = 0, last_time_ = 0;
  std::array<std::uint64_t, kActionCount> actions_{};
};

}  // namespace remat::report
