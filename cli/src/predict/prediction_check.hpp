#pragma once
// A job's measured peaks set beside its prediction (`remat-report ranks DIR --predicted P.json`):
// per rank, both figures and the error of the prediction.

#include "output/table.hpp"
#include "ranks/job_ranks.hpp"

#include <remat/pipeline/predict.hpp>

#include <cstdint>
#include <map>

namespace remat::report {

// Each rank's measured peak allocated, by rank.
std::map<std::uint64_t, std::uint64_t> measured_peaks(const JobRanks& job);

// A row per rank of the prediction (measured "-" where the job wrote no dump for it); notes
// name the largest error and the ranks measured but not predicted.
Report prediction_check_report(const pipeline::Prediction& prediction, const JobRanks& job);

}  // namespace remat::report
