#include "predict/prediction_check.hpp"

#include "output/dump_header.hpp"
#include "output/json_text.hpp"


#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace remat::report {

std::map<std::uint64_t, std::uint64_t> measured_peaks(const JobRanks& job) {
  std::map<std::uint64_t, std::uint64_t> peaks;
  for (const auto& [rank, row] : job.ranks()) peaks[rank] = row.peak_allocated_bytes;
  return peaks;
}

namespace {

constexpr int kPredictionCheckSchemaVersion = 1;

// The signed error of the prediction as a fraction of the measured peak; none without a measure.
std::optional<double> error_of(std::uint64_t predicted, const std::map<std::uint64_t, std::uint64_t>& measured,
                               int rank) {
  const auto it = measured.find(static_cast<std::uint64_t>(rank));
  if (it == measured.end() || it->second == 0) return std::nullopt;
  return (static_cast<double>(predicted) - static_cast<double>(it->second)) / static_cast<double>(it->second);
}

// The ranks with a measured dump and no row in the prediction, by rank.
std::vector<std::uint64_t> unpredicted_ranks(const pipeline::Prediction& prediction,
                                             const std::map<std::uint64_t, std::uint64_t>& measured) {
  std::set<std::uint64_t> predicted;
  for (const pipeline::RankPrediction& rank : prediction.per_rank)
    predicted.insert(static_cast<std::uint64_t>(rank.rank));
  std::vector<std::uint64_t> ranks;
  for (const auto& [rank, bytes] : measured) {
    if (predicted.count(rank) == 0) ranks.push_back(rank);
  }
  return ranks;
}

}  // namespace

Report prediction_check_report(const pipeline::Prediction& prediction, const JobRanks& job,
                               const std::vector<UnreadableDump>& unreadable) {
  const std::map<std::uint64_t, std::uint64_t> measured = measured_peaks(job);
  Report report;
  Table table{.id = "predicted",
              .title = "Measured against predicted peak per rank",
              .columns = {{"rank", "rank", true},
                          {"measured", "measured_bytes", true},
                          {"predicted", "predicted_bytes", true},
                          {"error", "error", true},
                          {"predicted at", "action", false}}};
  double worst = -1;
  std::uint64_t worst_rank = 0;
  for (const pipeline::RankPrediction& rank : prediction.per_rank) {
    const auto it = measured.find(static_cast<std::uint64_t>(rank.rank));
    if (it == measured.end() || it->second == 0) {
      // A rank measured at 0 B shows it (as --json does); its error, a fraction of 0, has none.
      const Cell measured_cell = it == measured.end() ? Cell::none() : Cell::bytes(0);
      table.rows.push_back({Cell::count(static_cast<std::uint64_t>(rank.rank)), measured_cell, Cell::bytes(rank.peak),
                            Cell::none(), Cell::text(rank.action)});
      continue;
    }
    const double error = *error_of(rank.peak, measured, rank.rank);
    if (std::fabs(error) > worst) {
      worst = std::fabs(error);
      worst_rank = it->first;
    }
    table.rows.push_back({Cell::count(static_cast<std::uint64_t>(rank.rank)), Cell::bytes(it->second),
                          Cell::bytes(rank.peak), Cell::share(error), Cell::text(rank.action)});
  }
  report.tables.push_back(std::move(table));
  if (!unreadable.empty()) report.tables.push_back(unreadable_table(unreadable));
  if (worst >= 0) {
    report.notes.push_back(fmt::format("largest error: rank {}, {:.1f}% of its measured peak", worst_rank,
                                       worst * 100.0));
  }
  std::string unpredicted;
  for (const std::uint64_t rank : unpredicted_ranks(prediction, measured)) {
    unpredicted += (unpredicted.empty() ? "" : ", ") + std::to_string(rank);
  }
  if (!unpredicted.empty()) {
    report.notes.push_back(fmt::format("ranks {} have dumps and no prediction: the prediction is of {} ranks",
                                       unpredicted, prediction.ranks));
  }
  return report;
}

void write_prediction_check_json(std::ostream& out, const pipeline::Prediction& prediction, const JobRanks& job,
                                 const std::vector<UnreadableDump>& unreadable) {
  const std::map<std::uint64_t, std::uint64_t> measured = measured_peaks(job);
  using Json = nlohmann::ordered_json;
  Json root = dump_header_json("prediction-check", kPredictionCheckSchemaVersion);
  root["model"] = prediction.model;
  root["schedule"] = prediction.schedule_name.empty() ? Json(nullptr) : Json(prediction.schedule_name);
  root["microbatches"] = prediction.microbatches;
  root["receive_buffers"] = std::string(pipeline::to_string(prediction.buffers));
  Json rows = Json::array();
  Json worst = nullptr;
  double worst_error = -1;
  for (const pipeline::RankPrediction& rank : prediction.per_rank) {
    const auto it = measured.find(static_cast<std::uint64_t>(rank.rank));
    const std::optional<double> error = error_of(rank.peak, measured, rank.rank);
    rows.push_back({{"rank", rank.rank},
                    {"measured_bytes", it != measured.end() ? Json(it->second) : Json(nullptr)},
                    {"predicted_bytes", rank.peak},
                    {"error", error ? Json(*error) : Json(nullptr)},
                    {"action", rank.action}});
    if (error && std::fabs(*error) > worst_error) {
      worst_error = std::fabs(*error);
      worst = {{"rank", rank.rank}, {"error", *error}};
    }
  }
  root["ranks"] = std::move(rows);
  root["largest_error"] = std::move(worst);
  Json unpredicted = Json::array();
  for (const std::uint64_t rank : unpredicted_ranks(prediction, measured)) unpredicted.push_back(rank);
  root["unpredicted_ranks"] = std::move(unpredicted);
  Json unread = Json::array();
  for (const UnreadableDump& dump : unreadable) unread.push_back({{"path", dump.path}, {"reason", dump.reason}});
  root["unreadable"] = std::move(unread);
  out << json_text(root, 2) << '\n';
}

}  // namespace remat::report
