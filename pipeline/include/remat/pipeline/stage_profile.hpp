#pragma once
// What one remat::pipeline stage costs in memory, measured once in one process (no ranks
// launched): the stage run on one microbatch the way PipelineRuntime runs it (its input a leaf
// over a receive buffer, a full backward, and the zero-bubble I then W), with every CPU tensor
// allocated through the tagging allocator, whose figures are read around each piece. The
// result is the StageProfile (runtime kRematRuntime) that predict_peaks and `remat-report
// predict` take, one per stage.
//
//   remat::pipeline::StageProfileOptions options{.model = "toy", .num_stages = 4};
//   options.example_input = at::randn({4, 64});
//   StageProfile profile = remat::pipeline::profile_stage(stage_module, options);
//   remat::write_dump("stage-profile-0.json", stage_profile_to_json(profile));

#include <remat/pipeline/predict.hpp>
#include <remat/pipeline/runtime.hpp>

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace remat::pipeline {

struct StageProfileOptions {
  std::string model;   // names the whole model, the same for each of its stages
  int num_stages = 0;  // stages the model is split into
  // One microbatch's input to the stage, of the size the job's microbatches have (CPU).
  at::Tensor example_input;
  // The last stage: its loss and one microbatch's target.
  LossFunction loss;
  at::Tensor target;
  // The job's optimizer step over the stage's parameters, if it has one: what it leaves held
  // (its state) and its peak above that are measured. Empty: no optimizer figures.
  std::function<void(const std::vector<at::Tensor>&)> optimizer_step;
};

// Measures `stage` (stage.stage of options.num_stages). The stage's parameters get gradients
// (as after a step's backward); clear them before training. Throws RuntimeError for options
// that do not fit the stage (a missing input, loss or target, a stage index out of range).
StageProfile profile_stage(const StageModule& stage, const StageProfileOptions& options);

}  // namespace remat::pipeline
