#pragma once
// The picture of a pipeline prediction, in the style of the `ranks` picture: each rank's
// predicted peak as a bar stacked by its parts, the action at the peak in its tooltip, and,
// where the job's dumps were read beside it, each rank's measured peak as a tick.

#include <remat/pipeline/predict.hpp>

#include <cstdint>
#include <map>
#include <string>

namespace remat::report {

// measured: rank -> measured peak, drawn over the bars where given.
std::string prediction_svg(const pipeline::Prediction& prediction,
                           const std::map<std::uint64_t, std::uint64_t>& measured = {});

}  // namespace remat::report
