#pragma once
// Replays allocator events into live bytes per group, with peaks.
//
// An allocation is live from its `alloc` event until its `free_requested` event, the point
// PyTorch's memory viewer treats as freed (the block may still be in use by another stream
// until `free_completed`, but the program has released it). A `free_completed` without a
// preceding `free_requested` also ends it. Frees of addresses allocated before the trace
// began (a ring buffer that dropped events) are counted as unmatched and change nothing.

#include "analysis/address_map.hpp"
#include "analysis/grouping.hpp"
#include "reader/trace_file.hpp"

#include <array>
#include <vector>

namespace remat::report {

class LiveReplay : public EventSink {
 public:
  LiveReplay(const TagTable& tags, GroupBy by);

  void on_event(const Event& event) override { apply(event); }
  // Applies one event; returns the group whose live bytes changed, or -1.
  std::int64_t apply(const Event& event);

  const std::vector<std::string>& labels() const { return grouper_.labels(); }
  const std::vector<std::uint64_t>& live() const { return live_; }
  const std::vector<std::uint64_t>& peak() const { return peak_; }
  const std::vector<std::uint64_t>& live_count() const { return live_count_; }
  const std::vector<std::uint64_t>& allocations() const { return allocations_; }
  std::uint64_t total() const { return total_; }
  std::uint64_t peak_total() const { return peak_total_; }
  std::int64_t peak_time() const { return peak_time_; }
  std::uint64_t reserved() const { return reserved_; }
  std::uint64_t peak_reserved() const { return peak_reserved_; }
  std::uint64_t events() const { return events_; }
  std::int64_t first_time() const { return first_time_; }
  std::int64_t last_time() const { return last_time_; }
  std::uint64_t unmatched_frees() const { return unmatched_frees_; }
  std::uint64_t action_count(Action action) const { return actions_[static_cast<std::size_t>(action)]; }

 private:
  void ensure(std::uint32_t group);
  void release(std::uint64_t address);

  Grouper grouper_;
  AddressMap blocks_;
  std::vector<std::uint64_t> live_, peak_, live_count_, allocations_;
  std::uint64_t total_ = 0, peak_total_ = 0, reserved_ = 0, peak_reserved_ = 0, events_ = 0, unmatched_frees_ = 0;
  std::int64_t peak_time_ = 0, first_time_ = 0, last_time_ = 0;
  std::int64_t changed_ = -1;
  std::array<std::uint64_t, kActionCount> actions_{};
};

}  // namespace remat::report
