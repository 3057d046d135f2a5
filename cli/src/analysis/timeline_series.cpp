#include "analysis/timeline_series.hpp"

#include <algorithm>
#include <numeric>

namespace remat::report {

TimelineBuilder::TimelineBuilder(const TagTable& tags, GroupBy by, std::size_t buckets)
    : replay_(tags, by),
      bucket_count_(std::max<std::size_t>(buckets, 2) & ~std::size_t{1}),
      max_total_(bucket_count_),
      state_(bucket_count_),
      by_(by) {}

void TimelineBuilder::capture() {
  state_[current_] = replay_.live();
  pending_ = false;
}

void TimelineBuilder::open_bucket(std::size_t index) {
  if (pending_) capture();
  for (std::size_t b = current_ + 1; b <= index; ++b) {
    max_total_[b] = replay_.total();
    state_[b] = replay_.live();
  }
  current_ = index;
}

void TimelineBuilder::coarsen() {
  if (pending_) capture();
  const std::size_t half = bucket_count_ / 2;
  for (std::size_t i = 0; i < half; ++i) {
    const std::size_t a = 2 * i;
    const std::size_t b = 2 * i + 1;
    const std::size_t pick = (b <= current_ && max_total_[b] > max_total_[a]) ? b : a;
    max_total_[i] = max_total_[pick];
    state_[i] = std::move(state_[pick]);
  }
  for (std::size_t i = half; i < bucket_count_; ++i) {
    max_total_[i] = 0;
    state_[i].clear();
  }
  current_ /= 2;
  width_ *= 2;
}

void TimelineBuilder::on_event(const Event& event) {
  if (!started_) {
    started_ = true;
    start_ = event.time_us;
    current_ = 0;
    max_total_[0] = 0;
    state_[0].clear();
  }
  const auto offset = static_cast<std::uint64_t>(event.time_us - start_);
  while (offset / static_cast<std::uint64_t>(width_) >= bucket_count_) coarsen();
  const auto index = static_cast<std::size_t>(offset / static_cast<std::uint64_t>(width_));
  if (index != current_) open_bucket(index);
  if (pending_ && (event.action == Action::free_requested || event.action == Action::free_completed)) capture();
  replay_.apply(event);
  if (replay_.total() > max_total_[current_]) {
    max_total_[current_] = replay_.total();
    pending_ = true;
  }
}

Timeline TimelineBuilder::finish(std::size_t max_series) {
  if (pending_) capture();
  Timeline timeline;
  timeline.start_us = start_;
  timeline.bucket_us = width_;
  timeline.events = replay_.events();
  timeline.peak_bytes = replay_.peak_total();
  timeline.peak_time_us = replay_.peak_time();
  timeline.end_us = replay_.last_time();
  timeline.grouped_by = std::string(to_string(by_));
  const std::size_t used = started_ ? current_ + 1 : 0;
  timeline.totals.assign(max_total_.begin(), max_total_.begin() + static_cast<std::ptrdiff_t>(used));

  const auto& labels = replay_.labels();
  const auto& peaks = replay_.peak();
  std::vector<std::size_t> order(labels.size());
  std::iota(order.begin(), order.end(), 0);
  order.erase(std::remove_if(order.begin(), order.end(), [&](std::size_t g) { return peaks[g] == 0; }), order.end());
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return peaks[a] > peaks[b]; });
  const bool merge = order.size() > max_series;
  const std::size_t kept = merge ? max_series - 1 : order.size();
  for (std::size_t s = 0; s < kept; ++s) {
    TimelineSeries series;
    series.label = labels[order[s]];
    series.peak = peaks[order[s]];
    series.values.resize(used);
    for (std::size_t b = 0; b < used; ++b) {
      series.values[b] = order[s] < state_[b].size() ? state_[b][order[s]] : 0;
    }
    timeline.series.push_back(std::move(series));
  }
  if (merge) {
    TimelineSeries other;
    other.label = GroupLabel::own("other (" + std::to_string(order.size() - kept) + " groups)");
    other.other = true;
    other.values.resize(used);
    for (std::size_t s = kept; s < order.size(); ++s) {
      for (std::size_t b = 0; b < used; ++b) {
        if (order[s] < state_[b].size()) other.values[b] += state_[b][order[s]];
      }
    }
    other.peak = used ? *std::max_element(other.values.begin(), other.values.end()) : 0;
    timeline.series.push_back(std::move(other));
  }
  return timeline;
}

}  // namespace remat::report
