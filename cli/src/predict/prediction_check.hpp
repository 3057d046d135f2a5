#pragma once
// A job's measured peaks set beside its prediction (`remat-report ranks DIR --predicted P.json`):
// per rank, both figures and the error of the prediction.

#include "output/table.hpp"
#include "ranks/job_ranks.hpp"

#include <remat/pipeline/predict.hpp>

#include <cstdint>
#include <map>
#include <ostream>

namespace remat::report {

// Each rank's measured peak allocated, by rank.
std::map<std::uint64_t, std::uint64_t> measured_peaks(const JobRanks& job);

// A row per rank of the prediction (measured "-" where the job wrote no dump for it); notes
// name the largest error and the ranks measured but not predicted.
Report prediction_check_report(const pipeline::Prediction& prediction, const JobRanks& job);

// `ranks DIR --predicted P.json --json`: the `prediction_check` dump
// (schemas/prediction_check.schema.json): what was predicted (model, schedule, microbatches,
// buffers), a row per predicted rank with both figures and the signed error as a fraction of
// the measured peak (null where the job wrote no dump for the rank), the rank with the largest
// error, and the ranks measured but not predicted.
void write_prediction_check_json(std::ostream& out, const pipeline::Prediction& prediction, const JobRanks& job);

}  // namespace remat::report
