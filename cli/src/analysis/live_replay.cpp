#include "analysis/live_replay.hpp"

namespace remat::report {

LiveReplay::LiveReplay(const TagTable& tags, GroupBy by) : grouper_(tags, by) {
  const std::size_t groups = grouper_.labels().size();
  live_.resize(groups);
  peak_.resize(groups);
  live_count_.resize(groups);
  allocations_.resize(groups);
  live_at_peak_.resize(groups);
  is_changed_.resize(groups);
}

void LiveReplay::ensure(std::uint32_t group) {
  if (group >= live_.size()) {
    live_.resize(group + 1);
    peak_.resize(group + 1);
    live_count_.resize(group + 1);
    allocations_.resize(group + 1);
    live_at_peak_.resize(group + 1);
    is_changed_.resize(group + 1);
  }
}

void LiveReplay::changed(std::uint32_t group) {
  if (is_changed_[group]) return;
  is_changed_[group] = true;
  changed_since_peak_.push_back(group);
}

void LiveReplay::release(std::uint64_t address) {
  const LiveBlock* block = blocks_.find(address);
  if (block == nullptr) {
    ++unmatched_frees_;
    return;
  }
  live_[block->group] -= block->size;
  changed(block->group);
  --live_count_[block->group];
  total_ -= block->size;
  blocks_.erase(address);
}

void LiveReplay::apply(const Event& event) {
  if (events_ == 0) first_time_ = event.time_us;
  last_time_ = event.time_us;
  ++events_;
  ++actions_[static_cast<std::size_t>(event.action)];
  switch (event.action) {
    case Action::alloc: {
      const std::uint32_t group = grouper_.group_of(event.tag, event.stream);
      ensure(group);
      total_ += event.size;
      live_[group] += event.size;
      changed(group);
      ++live_count_[group];
      ++allocations_[group];
      if (live_[group] > peak_[group]) peak_[group] = live_[group];
      if (total_ > peak_total_) {
        peak_total_ = total_;
        peak_time_ = event.time_us;
        for (const std::uint32_t changed_group : changed_since_peak_) {
          live_at_peak_[changed_group] = live_[changed_group];
          is_changed_[changed_group] = false;
        }
        changed_since_peak_.clear();
      }
      blocks_.put(event.address, LiveBlock{event.size, group});
      break;
    }
    case Action::free_requested: release(event.address); break;
    case Action::free_completed:
      // Already released at free_requested unless the producer only records completions.
      if (blocks_.find(event.address) != nullptr) release(event.address);
      break;
    case Action::segment_alloc:
      reserved_ += event.size;
      if (reserved_ > peak_reserved_) peak_reserved_ = reserved_;
      break;
    case Action::segment_free: reserved_ = event.size > reserved_ ? 0 : reserved_ - event.size; break;
    case Action::oom: break;
    case Action::retag: move(event); break;
  }
}

void LiveReplay::move(const Event& event) {
  LiveBlock* block = blocks_.find(event.address);
  if (block == nullptr) return;  // allocated before the trace began: not counted anywhere
  const std::uint32_t group = grouper_.group_of(event.tag, event.stream);
  if (group == block->group) return;
  ensure(group);
  live_[block->group] -= block->size;
  --live_count_[block->group];
  changed(block->group);
  live_[group] += block->size;
  ++live_count_[group];
  changed(group);
  if (live_[group] > peak_[group]) peak_[group] = live_[group];
  block->group = group;
}

}  // namespace remat::report
