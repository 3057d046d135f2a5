#pragma once
// A job's ranks side by side: each rank's figures gathered from its dumps (one snapshot, and
// any OOM dumps), then what the report shows: ranks by peak, the median and the imbalance,
// each tag group's spread across ranks, the first rank to run out of memory and how far the
// others were from it, and the ranks missing from 0 to the highest. Group names are kept once
// for the job, so a rank costs its numbers, not its names.

#include "ranks/rank_figures.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace remat::report {

// One rank as the report shows it: the peaks of its snapshot (or its fullest OOM dump).
struct RankRow : RankPeaks {
  std::uint64_t rank = 0;
  std::uint64_t ooms = 0;
  std::optional<OomFailure> first_oom;
  std::vector<OomFailure> oom_dumps;  // the OOM dumps read for this rank
  struct Group {
    std::uint32_t id = 0;  // into JobRanks::labels()
    std::uint64_t bytes = 0;
    std::optional<std::uint64_t> at_peak;
  };
  std::vector<Group> groups;  // by id

  // The group with the most bytes, if any.
  const Group* largest() const;
};

// A tag group across the job's ranks (a rank without the group counts 0 bytes).
struct GroupSpread {
  std::uint32_t id = 0;
  std::uint64_t min_bytes = 0;
  std::uint64_t median_bytes = 0;
  std::uint64_t max_bytes = 0;
  std::uint64_t max_rank = 0;  // the lowest rank holding max_bytes
  std::uint64_t ranks_with_group = 0;
};

// The rank that ran out of memory first, and where each other rank stood.
struct FirstFailure {
  std::uint64_t rank = 0;
  OomFailure failure;
  struct Other {
    std::uint64_t rank = 0;
    std::optional<std::int64_t> failed_after_us;  // another rank that ran out, this much later
    // A rank that did not: its device's bytes beyond its peak reserved (when the dump gives the device's size).
    std::optional<std::uint64_t> headroom_bytes;
  };
  std::vector<Other> others;  // ranks that failed, by time, then the rest by headroom
};

class JobRanks {
 public:
  // Adds a rank's dump. Returns why it is refused instead (a second snapshot for a rank, or the
  // same OOM twice), naming the dump already read.
  std::optional<std::string> add(const RankFigures& figures);

  // Ranks by peak allocated (highest first, then by rank).
  std::vector<const RankRow*> by_peak() const;
  const std::map<std::uint64_t, RankRow>& ranks() const { return ranks_; }
  const std::vector<GroupLabel>& labels() const { return labels_; }
  std::uint64_t dumps_read() const { return dumps_read_; }

  // The median of the ranks' peak allocated (the mean of the middle two for an even count).
  std::uint64_t median_peak_allocated() const;
  std::uint64_t median_peak_reserved() const;
  // max / median of peak allocated; empty when there are no ranks or the median is 0.
  std::optional<double> imbalance() const;
  // Each group's spread, largest max first.
  std::vector<GroupSpread> spreads() const;
  std::optional<FirstFailure> first_failure() const;
  // Ranks from 0 to the highest rank read that no readable dump named, as ranges (first, last).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> missing_ranks() const;

 private:
  // Takes the figures' peaks and groups into `row`.
  void set_peaks(RankRow& row, const RankFigures& figures);

  std::map<std::uint64_t, RankRow> ranks_;
  std::vector<GroupLabel> labels_;
  std::map<GroupLabel, std::uint32_t> label_ids_;
  std::uint64_t dumps_read_ = 0;
};

// Sorted ranks as ranges (first, last), and as people read them: "0-3, 8, 10-11".
std::vector<std::pair<std::uint64_t, std::uint64_t>> rank_ranges(const std::vector<std::uint64_t>& ranks);
// With `max_ranges`, the ranges past the first `max_ranges` fold into "..., 19996 (5000 ranks)".
std::string ranges_text(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
                        std::size_t max_ranges = SIZE_MAX);

}  // namespace remat::report
