#pragma once
// The small model the pipeline example and tests train: each stage is two Linear layers with
// a residual, x + W2 relu(W1 x + b1) + b2, optionally under remat::checkpoint (the first layer
// saved, the second recomputed). Parameters and data come from fixed seeds, so every process
// builds the same stages and microbatches, and a single process can train the whole model as a
// reference.

#include <remat/pipeline/runtime.hpp>
#include <remat/remat.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pipeline_example {

struct ModelShape {
  std::int64_t width = 64;
  std::int64_t microbatch_rows = 4;  // rows in one microbatch
  int microbatches = 8;
};

inline at::Tensor seeded_randn(std::vector<std::int64_t> shape, std::uint64_t seed) {
  const at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randn(shape, generator);
}

struct ToyStage {
  int index = 0;
  at::Tensor w1, b1, w2, b2;

  static ToyStage make(int index, std::int64_t width) {
    const auto seed = static_cast<std::uint64_t>(1000 + 10 * index);
    const double scale = 1.0 / static_cast<double>(width);
    auto parameter = [&](std::vector<std::int64_t> shape, std::uint64_t offset) {
      return (seeded_randn(std::move(shape), seed + offset) * scale).requires_grad_(true);
    };
    return {index, parameter({width, width}, 1), parameter({width}, 2), parameter({width, width}, 3),
            parameter({width}, 4)};
  }

  std::vector<at::Tensor> parameters() const { return {w1, b1, w2, b2}; }

  at::Tensor forward(const at::Tensor& x, bool checkpointed) const {
    if (!checkpointed) return x + at::linear(at::relu(at::linear(x, w1, b1)), w2, b2);
    const std::string name = "stages." + std::to_string(index);
    return remat::checkpoint({.region_name = name})([this](const at::Tensor& input) {
      const at::Tensor hidden =
          remat::region([this](const at::Tensor& h) { return at::relu(at::linear(h, w1, b1)); }, "fc1", false)(input);
      return input + remat::region([this](const at::Tensor& h) { return at::linear(h, w2, b2); }, "fc2")(hidden);
    })(x);
  }

  remat::pipeline::StageModule module(bool checkpointed) const {
    ToyStage copy = *this;
    return {index, [copy, checkpointed](const at::Tensor& x) { return copy.forward(x, checkpointed); }, parameters()};
  }
};

inline at::Tensor mean_squared_error(const at::Tensor& output, const at::Tensor& target) {
  return (output - target).pow(2).mean();
}

// Step `step`'s microbatches: inputs and targets of [microbatch_rows, width]. A rank makes only
// what its stages read (inputs for the first stage, targets for the last), as a job's data
// loader hands them out.
struct Batch {
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> targets;
};

inline Batch make_batch(const ModelShape& shape, int step, bool inputs = true, bool targets = true) {
  Batch batch;
  for (int m = 0; m < shape.microbatches; ++m) {
    const auto seed = static_cast<std::uint64_t>(7'000'000 + 1000 * step + 2 * m);
    if (inputs) batch.inputs.push_back(seeded_randn({shape.microbatch_rows, shape.width}, seed));
    if (targets) batch.targets.push_back(seeded_randn({shape.microbatch_rows, shape.width}, seed + 1) * 0.5);
  }
  return batch;
}

inline void zero_grads(const std::vector<at::Tensor>& parameters) {
  for (const auto& p : parameters) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

inline void sgd_step(const std::vector<at::Tensor>& parameters, double learning_rate) {
  const at::NoGradGuard no_grad;
  for (const auto& p : parameters) {
    if (p.grad().defined()) p.sub_(p.grad(), learning_rate);
  }
}

// The whole model on one process, no pipeline: each microbatch forward and backward in order,
// gradients accumulated and divided by the microbatch count, as the pipeline does.
inline std::vector<double> train_reference(std::vector<ToyStage>& stages, const ModelShape& shape, int steps,
                                           double learning_rate) {
  std::vector<double> step_losses;
  for (int step = 0; step < steps; ++step) {
    const Batch batch = make_batch(shape, step);
    double total = 0;
    for (auto& stage : stages) zero_grads(stage.parameters());
    for (int m = 0; m < shape.microbatches; ++m) {
      at::Tensor x = batch.inputs[static_cast<std::size_t>(m)];
      for (const auto& stage : stages) x = stage.forward(x, false);
      const at::Tensor loss = mean_squared_error(x, batch.targets[static_cast<std::size_t>(m)]);
      loss.backward();
      total += loss.item<double>();
    }
    for (auto& stage : stages) {
      for (const auto& p : stage.parameters()) p.mutable_grad().div_(shape.microbatches);
      sgd_step(stage.parameters(), learning_rate);
    }
    step_losses.push_back(total / shape.microbatches);
  }
  return step_losses;
}

}  // namespace pipeline_example
