#include "predict/prediction_check.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <string>

namespace remat::report {

std::map<std::uint64_t, std::uint64_t> measured_peaks(const JobRanks& job) {
  std::map<std::uint64_t, std::uint64_t> peaks;
  for (const auto& [rank, row] : job.ranks()) peaks[rank] = row.peak_allocated_bytes;
  return peaks;
}

Report prediction_check_report(const pipeline::Prediction& prediction, const JobRanks& job) {
  const std::map<std::uint64_t, std::uint64_t> measured = measured_peaks(job);
  Report report;
  Table table;
  table.id = "predicted";
  table.title = "Measured against predicted peak per rank";
  table.columns = {{"rank", "rank", true},          {"measured", "measured_bytes", true},
                   {"predicted", "predicted_bytes", true}, {"error", "error", true},
                   {"predicted at", "action", false}};
  double worst = -1;
  std::uint64_t worst_rank = 0;
  for (const pipeline::RankPrediction& rank : prediction.per_rank) {
    const auto it = measured.find(static_cast<std::uint64_t>(rank.rank));
    if (it == measured.end() || it->second == 0) {
      table.rows.push_back({Cell::count(static_cast<std::uint64_t>(rank.rank)), Cell::none(), Cell::bytes(rank.peak),
                            Cell::none(), Cell::text(rank.action)});
      continue;
    }
    const double error =
        (static_cast<double>(rank.peak) - static_cast<double>(it->second)) / static_cast<double>(it->second);
    if (std::fabs(error) > worst) {
      worst = std::fabs(error);
      worst_rank = it->first;
    }
    table.rows.push_back({Cell::count(static_cast<std::uint64_t>(rank.rank)), Cell::bytes(it->second),
                          Cell::bytes(rank.peak), Cell::share(error), Cell::text(rank.action)});
  }
  report.tables.push_back(std::move(table));
  if (worst >= 0) {
    report.notes.push_back(fmt::format("largest error: rank {}, {:.1f}% of its measured peak", worst_rank,
                                       worst * 100.0));
  }
  std::string unpredicted;
  for (const auto& [rank, bytes] : measured) {
    if (rank >= static_cast<std::uint64_t>(prediction.ranks)) unpredicted += (unpredicted.empty() ? "" : ", ") + std::to_string(rank);
  }
  if (!unpredicted.empty()) {
    report.notes.push_back(fmt::format("ranks {} have dumps and no prediction: the prediction is of {} ranks",
                                       unpredicted, prediction.ranks));
  }
  return report;
}

}  // namespace remat::report
