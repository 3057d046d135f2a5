#pragma once
// What a plan and a prediction record of the schedule they were made for.

#include <remat/pipeline/schedule.hpp>

namespace remat::pipeline::detail {

// Sets `result`'s (a PipelinePlan's or a Prediction's) schedule name and lowering from `options`,
// and its ranks, stages and microbatches from `lowered`.
template <typename Result, typename Options>
void record_schedule(Result& result, const Options& options, const Schedule& lowered) {
  result.schedule_name = options.schedule_name;
  result.lowering = options.lowering;
  result.ranks = lowered.num_ranks();
  result.stages = lowered.num_stages();
  result.microbatches = lowered.microbatches;
}

}  // namespace remat::pipeline::detail
