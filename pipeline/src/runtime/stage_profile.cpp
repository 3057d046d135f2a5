// Runs a stage as PipelineRuntime's forward, backward and backward_weight do (runtime.cpp),
// reading the tagging CPU allocator's figures around each piece: bytes allocated before,
// after, and at the peak in between. Sizes are what the allocator hands out, rounded as it
// rounds them, so they add up to what a rank's snapshot shows. A first pass creates the
// parameter gradients, as a step's first backward does (its peak is first_backward_transient);
// the measured passes then run as every later microbatch does.

#include <remat/pipeline/stage_profile.hpp>

#include <remat/alloc/allocator.hpp>
#include <remat/cpu_allocator.hpp>
#include <remat/pipeline/errors.hpp>

#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace remat::pipeline {
namespace {

// Bytes allocated through the tagging CPU allocator, now and at the peak since mark().
class Meter {
 public:
  std::uint64_t now() const { return clamp(allocator_.stats().allocated_bytes.current); }
  std::uint64_t mark() {
    allocator_.reset_peak_stats();
    return now();
  }
  std::uint64_t peak_above(std::uint64_t start) const {
    const std::uint64_t peak = clamp(allocator_.stats().allocated_bytes.peak);
    return peak > start ? peak - start : 0;
  }
  std::uint64_t above(std::uint64_t start) const { return now() > start ? now() - start : 0; }
  // What the allocator hands out for tensors of these sizes.
  std::uint64_t allocated_for(const std::vector<at::Tensor>& like) const {
    const std::uint64_t start = now();
    std::vector<at::Tensor> made;
    for (const at::Tensor& tensor : like) {
      if (tensor.defined()) made.push_back(at::empty_like(tensor));
    }
    return above(start);
  }

 private:
  static std::uint64_t clamp(std::int64_t bytes) { return bytes > 0 ? static_cast<std::uint64_t>(bytes) : 0; }
  alloc::CachingAllocator& allocator_ = alloc::cpu_allocator();
};

std::vector<at::Tensor> trained(const StageModule& stage) {
  std::vector<at::Tensor> parameters;
  for (const at::Tensor& p : stage.parameters) {
    if (p.defined() && p.requires_grad()) parameters.push_back(p);
  }
  return parameters;
}

void check_options(const StageModule& stage, const StageProfileOptions& options) {
  if (options.num_stages < 1 || stage.stage < 0 || stage.stage >= options.num_stages) {
    throw RuntimeError("profile_stage: stage " + std::to_string(stage.stage) + " of " +
                       std::to_string(options.num_stages) +
                       " stages; give StageProfileOptions::num_stages >= 1 and a stage index below it");
  }
  if (options.model.empty()) {
    throw RuntimeError(
        "profile_stage: StageProfileOptions::model is empty; name the whole model, the same for each "
        "of its stages");
  }
  if (!stage.forward) throw RuntimeError("profile_stage: stage " + std::to_string(stage.stage) + " has no forward");
  if (!options.example_input.defined()) {
    throw RuntimeError(
        "profile_stage: StageProfileOptions::example_input is empty; give one microbatch's input to "
        "the stage");
  }
  if (!options.example_input.device().is_cpu()) {
    throw RuntimeError("profile_stage: the example input is on " + options.example_input.device().str() +
                       "; stages are measured on CPU, through the tagging CPU allocator");
  }
  if (stage.stage == options.num_stages - 1 && (!options.loss || !options.target.defined())) {
    throw RuntimeError("profile_stage: stage " + std::to_string(stage.stage) +
                       " is the last and computes the loss; give StageProfileOptions::loss and target");
  }
}

}  // namespace

StageProfile profile_stage(const StageModule& stage, const StageProfileOptions& options) {
  check_options(stage, options);
  const CpuAllocatorGuard tagged;
  Meter meter;
  const bool first = stage.stage == 0;
  const bool last = stage.stage == options.num_stages - 1;
  const std::vector<at::Tensor> parameters = trained(stage);
  StageProfile profile;
  profile.model = options.model;
  profile.runtime = std::string(kRematRuntime);
  profile.stage = stage.stage;
  profile.num_stages = options.num_stages;
  profile.device_name = "cpu";
  profile.params = meter.allocated_for(stage.parameters);
  profile.grads = meter.allocated_for(parameters);
  profile.input_bytes = meter.allocated_for({options.example_input});
  if (last) profile.target_bytes = meter.allocated_for({options.target});

  // Stages past the first read a leaf of their own over a receive buffer.
  auto input_leaf = [&] {
    at::Tensor input = options.example_input.detach().clone();
    return first ? input : input.requires_grad_(true);
  };
  auto loss_of = [&](const at::Tensor& output) { return last ? options.loss(output, options.target) : at::Tensor(); };
  std::vector<std::int64_t> output_shape;

  for (const bool measured : {false, true}) {
    const at::Tensor input = input_leaf();
    // The gradient the next stage sends lands in a receive buffer, apart from the stage's memory.
    at::Tensor grad_root = measured && !last ? at::ones(output_shape, options.example_input.options()) : at::Tensor();
    const std::uint64_t base = meter.mark();
    at::Tensor output = stage.forward(input);
    if (!output.defined())
      throw RuntimeError("profile_stage: stage " + std::to_string(stage.stage) + "'s forward returned no tensor");
    at::Tensor loss = loss_of(output);
    const at::Tensor loss_value = last ? loss.detach() : at::Tensor();
    if (measured) {
      profile.forward_transient = meter.peak_above(base);
      profile.forward_kept = meter.above(base);
      profile.output_bytes = meter.allocated_for({output});
      if (last) profile.loss_bytes = meter.allocated_for({loss});
    } else {
      output_shape = output.sizes().vec();
      if (!last) grad_root = at::ones(output_shape, output.options());
    }
    const std::uint64_t before = meter.mark();
    torch::autograd::backward({last ? loss : output}, {grad_root});
    at::Tensor input_grad = first ? at::Tensor() : input.grad();
    if (!first && !input_grad.defined()) input_grad = at::zeros_like(input);
    if (measured) {
      profile.backward_transient = meter.peak_above(before);
      profile.input_grad_bytes = meter.allocated_for({input_grad});
    } else {
      profile.first_backward_transient = meter.peak_above(before);
    }
  }

  {  // The zero-bubble split: I computes input and weight gradients and keeps the latter until W.
    const at::Tensor input = input_leaf();
    const at::Tensor grad_root = last ? at::Tensor() : at::ones(output_shape, options.example_input.options());
    const std::uint64_t base = meter.now();
    at::Tensor output = stage.forward(input);
    at::Tensor loss = loss_of(output);
    const at::Tensor loss_value = last ? loss.detach() : at::Tensor();
    std::vector<at::Tensor> wrt;
    if (!first) wrt.push_back(input);
    wrt.insert(wrt.end(), parameters.begin(), parameters.end());
    const std::uint64_t start = meter.mark();
    std::vector<at::Tensor> grads = torch::autograd::grad({last ? loss : output}, wrt, {grad_root},
                                                          /*retain_graph=*/false, /*create_graph=*/false,
                                                          /*allow_unused=*/true);
    at::Tensor input_grad = first ? at::Tensor() : grads.front();
    if (!first && !input_grad.defined()) input_grad = at::zeros_like(input);
    std::vector<at::Tensor> weight_grads(grads.begin() + (first ? 0 : 1), grads.end());
    profile.input_backward_transient = meter.peak_above(start);
    output = at::Tensor();
    loss = at::Tensor();
    const std::uint64_t others = profile.input_grad_bytes + profile.loss_bytes;  // held apart from the kept set
    const std::uint64_t after = meter.above(base);
    profile.input_backward_kept = after > others ? after - others : 0;
    const std::uint64_t weight_start = meter.mark();
    for (std::size_t i = 0; i < weight_grads.size(); ++i) {
      if (!weight_grads[i].defined()) continue;
      at::Tensor& grad = parameters[i].mutable_grad();
      if (grad.defined()) {
        grad.add_(weight_grads[i]);
      } else {
        grad = weight_grads[i];
      }
    }
    weight_grads.clear();
    profile.weight_backward_transient = meter.peak_above(weight_start);
  }

  if (options.optimizer_step) {
    const std::uint64_t before = meter.now();
    options.optimizer_step(stage.parameters);  // the first step creates any state
    profile.optimizer_state = meter.above(before);
    const std::uint64_t start = meter.mark();
    options.optimizer_step(stage.parameters);
    profile.optimizer_transient = meter.peak_above(start);
  }
  return profile;
}

}  // namespace remat::pipeline
