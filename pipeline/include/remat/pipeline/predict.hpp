#pragma once
// Each rank's memory peak predicted before a pipeline job runs: stage profiles (what one
// microbatch costs on each stage, measured once in one process) walked through a lowered
// schedule, rank by rank, with the receive buffers the plan gives (stock or pooled). Per rank:
// the peak, the action at which it happens and what it is made of.
// Dumps: `stage_profile` (schemas/stage_profile.schema.json) and `pipeline_prediction`
// (schemas/pipeline_prediction.schema.json).

#include <remat/pipeline/schedule.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remat::pipeline {

// The pipeline runtime a stage was profiled for, which decides what a rank holds and until
// when (see predict.cpp): PyTorch 2.11's torch.distributed.pipelining (profile_stage in Python)
// or this project's remat::pipeline::PipelineRuntime (remat::pipeline::profile_stage in C++).
inline constexpr std::string_view kTorchRuntime = "torch.distributed.pipelining";
inline constexpr std::string_view kRematRuntime = "remat::pipeline";

// What one stage costs, in bytes as the allocator hands them out (sizes rounded as it rounds
// them), for one microbatch of a fixed size.
struct StageProfile {
  std::string model;       // names the whole model; every profile of one prediction has the same
  std::string runtime = std::string(kTorchRuntime);  // kTorchRuntime or kRematRuntime
  int stage = 0;           // its index, 0..num_stages-1
  int num_stages = 0;      // stages the model is split into
  std::string device_name; // where it was measured: cpu, cuda:0
  std::uint64_t params = 0;
  std::uint64_t grads = 0;                // created by the stage's first backward of a step
  std::uint64_t optimizer_state = 0;      // held from the first optimizer step on
  std::uint64_t optimizer_transient = 0;  // above params, grads and state during the optimizer step
  std::uint64_t input_bytes = 0;          // one microbatch's input (stage 0: its share of the batch)
  std::uint64_t target_bytes = 0;         // last stage: one microbatch's target (its share of the batch)
  std::uint64_t output_bytes = 0;         // what forward sends on (last stage, torch: the output kept for the step)
  std::uint64_t input_grad_bytes = 0;     // what backward sends back (0 on stage 0)
  std::uint64_t loss_bytes = 0;           // last stage: each microbatch's loss, kept for the step
  std::uint64_t forward_kept = 0;         // what forward keeps until the backward (its output included)
  std::uint64_t forward_transient = 0;    // above the level before forward, at forward's peak
  std::uint64_t backward_transient = 0;   // above the level before a full backward (B), at its peak
  // A step's first B on the stage, which creates the parameter gradients: its peak above the
  // level before it, those gradients included. Absent in profiles written before it was
  // measured; the walk then takes backward_transient for it (and may under-predict a step
  // whose peak is that backward, as with one microbatch).
  std::optional<std::uint64_t> first_backward_transient;
  // Zero-bubble split (I then W): what the microbatch keeps from I until its W (instead of
  // forward_kept; the input gradient not included: torch keeps the graph for W, remat::pipeline
  // the weight gradients I computed), and each one's peak above its start.
  std::uint64_t input_backward_kept = 0;
  std::uint64_t input_backward_transient = 0;
  std::uint64_t weight_backward_transient = 0;
};

// Reads and checks a `stage_profile` dump; throws PlanError naming `source`, the field and the fix.
StageProfile stage_profile_from_json(std::string_view text, std::string_view source);
std::string stage_profile_to_json(const StageProfile& profile);
// A profile from its byte figures by the dump's names ("params", "forward_kept", ...); throws
// PlanError for a name missing or unknown, or a stage outside 0..num_stages-1.
StageProfile stage_profile_of(std::string model, int stage, int num_stages, std::string device_name,
                              const std::map<std::string, std::uint64_t>& bytes);

enum class ReceiveBuffers { stock, pooled };

struct PredictOptions {
  std::string schedule_name;  // "1f1b", ...; empty for a CSV
  // How the lowered order was made, which decides when a sent tensor is let go: "step"
  // (ScheduleGPipe / Schedule1F1B's own loops: 1F1B waits each send at once, GPipe keeps every
  // send's work until step() returns), anything else (PyTorch's action runtime): at the step's end.
  std::string lowering;
  ReceiveBuffers buffers = ReceiveBuffers::stock;
  int spare_sets = 0;           // pooled, torch: spare sets per ring beyond the colored minimum
  // Pooled, remat::pipeline: RuntimeOptions::slack, which sizes NeMo's closed-form rings where
  // they apply and are safe (1F1B); the runtime's ring is the plan's ring_size.
  int slack = 2;
  bool optimizer_step = true;   // the step ends with the optimizer's step (its state held throughout)
};

// A rank's memory at one moment, by what holds it.
struct PeakParts {
  std::uint64_t params = 0;
  std::uint64_t grads = 0;
  std::uint64_t optimizer_state = 0;
  std::uint64_t activations = 0;      // what the microbatches in flight keep for their backward
  // Stock sets (under PyTorch with what a V's turn hands between its two stages) or the pooled rings.
  std::uint64_t receive_buffers = 0;
  // Sent outputs and input gradients not yet let go (under PyTorch, an input's .grad after I
  // until the next step), pooled handoffs on one rank, the last stage's outputs.
  std::uint64_t held_for_sends = 0;
  std::uint64_t batch = 0;            // the step's inputs (rank of stage 0) and targets (last stage's)
  std::uint64_t transient = 0;        // the running action's own peak
  std::uint64_t total() const;
};

struct RankPrediction {
  int rank = 0;
  std::vector<int> stages;
  std::uint64_t peak = 0;
  int position = -1;       // index in the rank's lowered order; -1 for the step's end or optimizer step
  std::string action;      // "1B3", "merge outputs", "optimizer step"
  int in_flight = 0;       // microbatches whose activations are held at the peak
  PeakParts parts;
};

struct Prediction {
  std::string model;
  std::string runtime = std::string(kTorchRuntime);  // the profiles' runtime
  std::string schedule_name;
  std::string lowering;
  ReceiveBuffers buffers = ReceiveBuffers::stock;
  int ranks = 0;
  int stages = 0;
  int microbatches = 0;
  std::vector<RankPrediction> per_rank;  // by rank
};

// Checks the profiles against the schedule (one per stage, one model, one runtime, matching
// boundaries) and walks every rank's lowered order. Throws PlanError for profiles that do not fit.
Prediction predict_peaks(const Schedule& lowered, const std::vector<StageProfile>& profiles,
                         const PredictOptions& options);

// The `pipeline_prediction` dump, and reading one back (remat-report ranks --predicted).
std::string prediction_to_json(const Prediction& prediction);
Prediction prediction_from_json(std::string_view text, std::string_view source);

std::string_view to_string(ReceiveBuffers buffers);

}  // namespace remat::pipeline
