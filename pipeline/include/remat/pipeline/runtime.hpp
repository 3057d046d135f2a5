#pragma once
// Pipeline-parallel training steps for LibTorch: each rank runs its actions of a lowered
// schedule in order, moving activations and gradients through a Communicator, with receive
// buffers either stock (a set per microbatch) or pooled into the rings of the plan.
//
//   auto comm = Communicator::connect(read_launch_environment());
//   auto lowered = lower_schedule(generate_schedule(ScheduleKind::one_f_one_b, {4, {}, 16}));
//   PipelineRuntime pipeline(comm, lowered, {.schedule_name = "1f1b", .activation_shape = {8, 64}},
//                            {my_stage}, mse_loss);
//   optimizer.zero_grad();
//   auto losses = pipeline.step(microbatch_inputs, microbatch_targets);
//   optimizer.step();

#include <remat/pipeline/communicator.hpp>
#include <remat/pipeline/plan.hpp>
#include <remat/pipeline/schedule.hpp>

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace remat::pipeline {

// One stage of the model: its forward over one microbatch and the parameters its gradients
// accumulate into. The callable may use remat::checkpoint inside.
struct StageModule {
  int stage = 0;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<at::Tensor> parameters;
};

// Applied by the last stage to its output and the microbatch's target.
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

enum class BufferMode {
  stock,   // one receive buffer set per microbatch and direction, as PyTorch's runtime keeps
  pooled,  // the ring of the plan: ring_size sets per stage and direction
};

struct RuntimeOptions {
  std::string schedule_name;  // the generator's name, for NeMo's closed form; empty for a custom one
  BufferMode buffers = BufferMode::pooled;
  int slack = 2;  // see PlanOptions::slack
  // One microbatch's activation at every stage boundary (so also its gradient).
  std::vector<std::int64_t> activation_shape;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  // Divide gradients by the number of microbatches after each step (PyTorch's scale_grads),
  // for a loss that averages over a microbatch.
  bool scale_grads = true;
  // For negative-control tests only: pooled rings this many sets below the colored minimum
  // (at least one set), and no check that a slot's holder is done with it before reuse.
  int rings_below_minimum = 0;
  bool ownership_guard = true;
};

class PipelineRuntime {
 public:
  // `lowered` is the schedule every rank runs (lower_schedule of a generated or loaded one);
  // `stages` are the stages it maps to this rank. Throws RuntimeError when the world size,
  // the stages or the options do not fit the schedule, and on every rank when the ranks differ
  // in schedule, microbatches, stage map, activation shape or dtype (each rank shares them
  // through the store and waits up to the communicator's timeout for the others: every rank
  // constructs its PipelineRuntime objects in the same order); allocates the receive buffers,
  // each tagged with its receive slot (stage, direction, slot; the microbatch for stock buffers).
  PipelineRuntime(std::shared_ptr<Communicator> communicator, Schedule lowered, RuntimeOptions options,
                  std::vector<StageModule> stages, LossFunction loss);
  ~PipelineRuntime();
  PipelineRuntime(const PipelineRuntime&) = delete;
  PipelineRuntime& operator=(const PipelineRuntime&) = delete;

  // One training step over the microbatches: forward, backward and gradient accumulation into
  // the stages' parameters (zero them before, step the optimizer after). `inputs` are needed on
  // the rank of the first stage and `targets` on the rank of the last (one per microbatch;
  // elsewhere they may be empty). Returns each microbatch's loss on the rank of the last stage,
  // nothing elsewhere.
  std::vector<at::Tensor> step(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets);

  const PipelinePlan& plan() const;
  // Receive buffer sets this rank holds for `stage` in `direction` (0 where it receives nothing).
  int buffer_sets(int stage, Direction direction) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat::pipeline
