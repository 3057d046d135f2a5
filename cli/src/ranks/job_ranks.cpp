#include "ranks/job_ranks.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace remat::report {

namespace {

// The median of `values` (reordered): the mean of the middle two for an even count.
std::uint64_t median_of(std::vector<std::uint64_t>& values) {
  if (values.empty()) return 0;
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle), values.end());
  const std::uint64_t upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  const std::uint64_t lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle));
  return lower / 2 + upper / 2 + (lower % 2 + upper % 2) / 2;
}

bool earlier(const OomFailure& a, const OomFailure& b) { return a.time_us < b.time_us; }

}  // namespace

const RankRow::Group* RankRow::largest() const {
  const Group* best = nullptr;
  for (const Group& group : groups) {
    if (best == nullptr || group.bytes > best->bytes) best = &group;
  }
  return best;
}

void JobRanks::set_peaks(RankRow& row, const RankFigures& figures) {
  static_cast<RankPeaks&>(row) = figures;
  row.groups.clear();
  for (const GroupBytes& group : figures.groups) {
    const auto [it, inserted] = label_ids_.try_emplace(group.label, static_cast<std::uint32_t>(labels_.size()));
    if (inserted) labels_.push_back(group.label);
    row.groups.push_back(RankRow::Group{it->second, group.bytes, group.at_peak});
  }
  std::sort(row.groups.begin(), row.groups.end(),
            [](const RankRow::Group& a, const RankRow::Group& b) { return a.id < b.id; });
}

std::optional<std::string> JobRanks::add(const RankFigures& figures) {
  const bool is_oom = figures.source == RankSource::oom;
  const auto [it, inserted] = ranks_.try_emplace(figures.rank);
  RankRow& row = it->second;
  if (!inserted) {
    if (!is_oom && row.source != RankSource::oom) {
      return fmt::format(
          "rank {} is already read from {}; a rank's peaks come from one snapshot: pass one job's dumps, "
          "one snapshot a rank",
          figures.rank, row.path);
    }
    if (is_oom) {
      for (const OomFailure& seen : row.oom_dumps) {
        if (seen.time_us == figures.first_oom->time_us && seen.requested_bytes == figures.first_oom->requested_bytes) {
          return fmt::format(
              "rank {}'s out-of-memory error at the same time and size is already read from {}: the "
              "same dump twice",
              figures.rank, seen.path);
        }
      }
    }
  }
  ++dumps_read_;
  row.rank = figures.rank;
  // A snapshot's peaks win over an OOM dump's bytes at the failure; among OOM dumps, the fullest.
  if (inserted || (!is_oom && row.source == RankSource::oom) ||
      (is_oom && row.source == RankSource::oom && figures.peak_allocated_bytes > row.peak_allocated_bytes)) {
    set_peaks(row, figures);
  }
  if (is_oom) row.oom_dumps.push_back(*figures.first_oom);
  row.ooms = std::max(row.ooms, figures.ooms);
  if (figures.first_oom && (!row.first_oom || earlier(*figures.first_oom, *row.first_oom))) {
    row.first_oom = figures.first_oom;
  }
  return std::nullopt;
}

std::vector<const RankRow*> JobRanks::by_peak() const {
  std::vector<const RankRow*> rows;
  rows.reserve(ranks_.size());
  for (const auto& [rank, row] : ranks_) rows.push_back(&row);
  std::stable_sort(rows.begin(), rows.end(), [](const RankRow* a, const RankRow* b) {
    return a->peak_allocated_bytes > b->peak_allocated_bytes;
  });
  return rows;
}

std::uint64_t JobRanks::median_peak_allocated() const {
  std::vector<std::uint64_t> values;
  values.reserve(ranks_.size());
  for (const auto& [rank, row] : ranks_) values.push_back(row.peak_allocated_bytes);
  return median_of(values);
}

std::uint64_t JobRanks::median_peak_reserved() const {
  std::vector<std::uint64_t> values;
  values.reserve(ranks_.size());
  for (const auto& [rank, row] : ranks_) values.push_back(row.peak_reserved_bytes);
  return median_of(values);
}

std::optional<double> JobRanks::imbalance() const {
  const std::uint64_t median = median_peak_allocated();
  if (ranks_.empty() || median == 0) return std::nullopt;
  std::uint64_t max = 0;
  for (const auto& [rank, row] : ranks_) max = std::max(max, row.peak_allocated_bytes);
  return static_cast<double>(max) / static_cast<double>(median);
}

std::vector<GroupSpread> JobRanks::spreads() const {
  std::vector<std::vector<std::uint64_t>> values(labels_.size());
  std::vector<GroupSpread> spreads(labels_.size());
  for (std::uint32_t id = 0; id < labels_.size(); ++id) {
    spreads[id].id = id;
    values[id].reserve(ranks_.size());
  }
  for (const auto& [rank, row] : ranks_) {
    std::size_t next = 0;  // row.groups is sorted by id
    for (std::uint32_t id = 0; id < labels_.size(); ++id) {
      std::uint64_t bytes = 0;
      if (next < row.groups.size() && row.groups[next].id == id) {
        bytes = row.groups[next++].bytes;
        ++spreads[id].ranks_with_group;
      }
      values[id].push_back(bytes);
      if (bytes > spreads[id].max_bytes) {
        spreads[id].max_bytes = bytes;
        spreads[id].max_rank = rank;  // ranks_ is in rank order: the first rank at the max stays
      }
    }
  }
  for (std::uint32_t id = 0; id < labels_.size(); ++id) {
    spreads[id].min_bytes = values[id].empty() ? 0 : *std::min_element(values[id].begin(), values[id].end());
    spreads[id].median_bytes = median_of(values[id]);
  }
  std::stable_sort(spreads.begin(), spreads.end(), [this](const GroupSpread& a, const GroupSpread& b) {
    if (a.max_bytes != b.max_bytes) return a.max_bytes > b.max_bytes;
    return labels_[a.id] < labels_[b.id];
  });
  return spreads;
}

std::optional<FirstFailure> JobRanks::first_failure() const {
  const RankRow* first = nullptr;
  for (const auto& [rank, row] : ranks_) {
    if (row.first_oom && (first == nullptr || earlier(*row.first_oom, *first->first_oom))) first = &row;
  }
  if (first == nullptr) return std::nullopt;
  FirstFailure result{first->rank, *first->first_oom, {}};
  std::vector<FirstFailure::Other> failed, standing;
  for (const auto& [rank, row] : ranks_) {
    if (&row == first) continue;
    if (row.first_oom) {
      failed.push_back({rank, row.first_oom->time_us - first->first_oom->time_us, std::nullopt});
      continue;
    }
    std::optional<std::uint64_t> headroom;
    if (row.device_total_bytes > 0) {
      headroom =
          row.device_total_bytes > row.peak_reserved_bytes ? row.device_total_bytes - row.peak_reserved_bytes : 0;
    }
    standing.push_back({rank, std::nullopt, headroom});
  }
  std::stable_sort(failed.begin(), failed.end(),
                   [](const auto& a, const auto& b) { return *a.failed_after_us < *b.failed_after_us; });
  std::stable_sort(standing.begin(), standing.end(), [](const auto& a, const auto& b) {
    return a.headroom_bytes.value_or(UINT64_MAX) < b.headroom_bytes.value_or(UINT64_MAX);
  });
  result.others = std::move(failed);
  result.others.insert(result.others.end(), standing.begin(), standing.end());
  return result;
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> JobRanks::missing_ranks() const {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> missing;
  std::uint64_t expected = 0;
  for (const auto& [rank, row] : ranks_) {
    if (rank > expected) missing.emplace_back(expected, rank - 1);
    expected = rank + 1;
  }
  return missing;
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> rank_ranges(const std::vector<std::uint64_t>& ranks) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const std::uint64_t rank : ranks) {
    if (!ranges.empty() && ranges.back().second + 1 == rank) {
      ranges.back().second = rank;
    } else {
      ranges.emplace_back(rank, rank);
    }
  }
  return ranges;
}

std::string ranges_text(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges, std::size_t max_ranges) {
  auto range = [](const std::pair<std::uint64_t, std::uint64_t>& r) {
    return r.first == r.second ? std::to_string(r.first) : fmt::format("{}-{}", r.first, r.second);
  };
  std::string text;
  for (std::size_t i = 0; i < ranges.size() && i < max_ranges; ++i) text += (i == 0 ? "" : ", ") + range(ranges[i]);
  if (ranges.size() > max_ranges) {
    std::uint64_t ranks = 0;
    for (const auto& [first, last] : ranges) ranks += last - first + 1;
    text += fmt::format(", ..., {} ({} ranks)", range(ranges.back()), ranks);
  }
  return text;
}

}  // namespace remat::report
