#pragma once
// A job's measured peaks set beside its prediction (`remat-report ranks DIR --predicted P.json`):
// per rank, both figures and the error of the prediction.

#include "output/table.hpp"
#include "ranks/job_ranks.hpp"
#include "ranks/ranks_report.hpp"

#include <remat/pipeline/predict.hpp>

#include <cstdint>
#include <map>
#include <ostream>

namespace remat::report {

// Each rank's measured peak allocated, by rank.
std::map<std::uint64_t, std::uint64_t> measured_peaks(const JobRanks& job);

// A row per rank of the prediction (measured "-" where the job wrote no dump for it); notes
// name the largest error and the ranks measured but not predicted; the dumps that could not be
// read are listed with why (a rank whose dump is cut short shows "-", not a silent gap).
Report prediction_check_report(const pipeline::Prediction& prediction, const JobRanks& job,
                               const std::vector<UnreadableDump>& unreadable);

// `ranks DIR --predicted P.json --json`: the `prediction_check` dump
// (schemas/prediction_check.schema.json): what was predicted (model, schedule, microbatches,
// buffers), a row per predicted rank with both figures and the signed error as a fraction of
// the measured peak (null where the job wrote no dump for the rank), the rank with the largest
// error, the ranks measured but not predicted, and the dumps that could not be read.
void write_prediction_check_json(std::ostream& out, const pipeline::Prediction& prediction, const JobRanks& job,
                                 const std::vector<UnreadableDump>& unreadable);

}  // namespace remat::report
