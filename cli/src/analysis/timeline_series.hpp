#pragma once
// Memory over time, aggregated into a fixed number of time buckets so that millions of
// events become a picture of bounded size. Each bucket holds the state at the moment its
// live total was highest, so peaks survive aggregation and the stacked series of a bucket
// add up to its total exactly. Bucket width doubles (merging neighbours) whenever the
// trace outgrows the range, so one pass suffices and the end time need not be known.

#include "analysis/live_replay.hpp"

#include <optional>
#include <string>
#include <vector>

namespace remat::report {

struct TimelineSeries {
  GroupLabel label;
  bool other = false;                 // the groups beyond the series limit, summed
  std::uint64_t peak = 0;             // the group's own peak
  std::vector<std::uint64_t> values;  // per bucket
};

struct Timeline {
  std::int64_t start_us = 0;
  std::int64_t bucket_us = 1;
  std::vector<std::uint64_t> totals;   // per bucket
  std::vector<TimelineSeries> series;  // largest first; "other" last when groups were merged
  std::uint64_t peak_bytes = 0;
  std::optional<std::int64_t> peak_time_us;  // empty when nothing was ever live
  std::int64_t end_us = 0;
  std::uint64_t events = 0;
  std::string grouped_by;
};

class TimelineBuilder : public EventSink {
 public:
  TimelineBuilder(const TagTable& tags, GroupBy by, std::size_t buckets);
  void on_event(const Event& event) override;
  // `max_series` groups by peak, the rest summed into "other".
  Timeline finish(std::size_t max_series);

 private:
  void open_bucket(std::size_t index);
  void capture();
  void coarsen();

  LiveReplay replay_;
  std::size_t bucket_count_;
  bool started_ = false;
  std::int64_t start_ = 0;
  std::int64_t width_ = 1;
  std::size_t current_ = 0;
  bool pending_ = false;
  std::vector<std::uint64_t> max_total_;
  std::vector<std::vector<std::uint64_t>> state_;  // per bucket: live bytes per group
  GroupBy by_;
};

}  // namespace remat::report
