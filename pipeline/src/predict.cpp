// Walks each rank's lowered order with the stage profiles' figures: the level of memory after
// every action and the action's own peak on top of it. What a pipeline runtime holds, and
// until when, is PyTorch's torch.distributed.pipelining behaviour:
// - a forward keeps its activations and output (the stage's forward cache) until the
//   microbatch's backward (full B, or W after I under a zero-bubble split);
// - a sent tensor is held by its send's work until the work is let go: Schedule1F1B waits each
//   send at once and drops its work, while ScheduleGPipe keeps every send's work (forward and
//   backward, waited or not) in its pending lists until step() returns, and the action runtime
//   waits every send at the step's end; so under both a sent output outlives its microbatch's
//   backward until the step ends. A tensor handed to a stage on the same rank is let go by the
//   backward that reads it;
// - the last stage keeps every microbatch's output and loss for the step (its merged output);
// - I (stage_backward_input) leaves each input gradient on the stage's input leaf as its .grad,
//   where clear_runtime_states lets it go at the next step's start: a received input's
//   gradient outlives the step, through the optimizer step (a full B sets .grad to None);
// - V schedules hand tensors between the two stages of the V's turn on one rank
//   (set_local_fwd_input, set_local_bwd_input) instead of sending them. With stock buffers
//   they stay in the receiving stage's records (args_recv_info, grad_recv_info) until the next
//   step's handoff of the same microbatch replaces them: one set per microbatch and direction,
//   as stock receive buffers. Pooled, the pool drops them once their last reader is done: the
//   activation after the receiving stage's backward (B, or W after I), the gradient after the
//   handing-back stage's backward and, after I, the receiving stage's W (its leaf's .grad);
// - parameter gradients appear at a stage's first backward (zero_grad(set_to_none=True)) and
//   the optimizer state is held throughout (a step after the first);
// - receive buffers are allocated once and held: one set per microbatch (stock) or the plan's
//   rings (pooled).
// remat::pipeline's PipelineRuntime (profiles whose runtime is kRematRuntime) holds memory
// differently, and the walk follows it:
// - every send is waited for at the step's end, whatever the schedule, so a sent output
//   outlives its microbatch's backward until then;
// - each microbatch's input gradient (stages past the first) is kept in the runtime's state
//   until the step's end, sent or handed to the stage before on the same rank; nothing is kept
//   past the step (I takes its gradients with autograd::grad, not into .grad), and an
//   activation handed on the same rank is let go by the receiving stage's backward (B or I),
//   before the handing stage lets its own output go;
// - the last stage keeps each microbatch's loss for step()'s result and drops its output at
//   the backward (no merged output);
// - I computes the input and the weight gradients in one pass and keeps the weight gradients
//   until W adds them in (stage 0 included, which PyTorch runs whole at W);
// - pooled rings are the plan's ring_size with the runtime's slack (NeMo's closed form where
//   it is 1F1B's and safe, the colored minimum elsewhere).

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/plan.hpp>
#include <remat/pipeline/predict.hpp>

#include "detail/schedule_record.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace remat::pipeline {
namespace {

std::string bytes_text(std::uint64_t bytes) { return std::to_string(bytes) + " bytes"; }

// Sums and products of byte figures, refused past 2^64 - 1 instead of wrapping into a peak
// smaller than its parts. `what` names the figure that was being added.
[[noreturn]] void refuse_overflow(int rank, const std::string& what) {
  throw PlanError("rank " + std::to_string(rank) + "'s predicted memory passes 2^64 - 1 bytes (18446744073709551615) " +
                  "with " + what + "; no real stage holds that much: profile the stage again");
}

std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, int rank, const std::string& what) {
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) refuse_overflow(rank, what);
  return sum;
}

std::uint64_t checked_times(std::uint64_t bytes, std::uint64_t count, int rank, const std::string& what) {
  std::uint64_t product = 0;
  if (__builtin_mul_overflow(bytes, count, &product)) refuse_overflow(rank, what);
  return product;
}

std::string figure_text(int stage, const char* figure) { return "stage " + std::to_string(stage) + "'s " + figure; }

void check_profiles(const Schedule& lowered, const std::vector<StageProfile>& profiles) {
  const int stages = lowered.num_stages();
  if (static_cast<int>(profiles.size()) != stages) {
    throw PlanError("the schedule has " + std::to_string(stages) + " stages and " + std::to_string(profiles.size()) +
                    " stage profiles were given; give one profile per stage (profile_stage for each of stages 0.." +
                    std::to_string(stages - 1) + ")");
  }
  for (int s = 0; s < stages; ++s) {
    const StageProfile& profile = profiles[static_cast<std::size_t>(s)];
    if (profile.num_stages != stages) {
      throw PlanError("the profile of stage " + std::to_string(profile.stage) + " is of a model split into " +
                      std::to_string(profile.num_stages) + " stages, and the schedule runs " + std::to_string(stages) +
                      "; profile the stages of this split, or give a schedule with " +
                      std::to_string(profile.num_stages) + " stages");
    }
    if (profile.stage != s) {
      throw PlanError("two profiles are of stage " + std::to_string(profile.stage) + " and none of stage " +
                      std::to_string(s) + "; give each stage's profile once");
    }
    if (profile.runtime != profiles.front().runtime) {
      throw PlanError("the profile of stage " + std::to_string(s) + " was made for " + profile.runtime +
                      " and that of stage 0 for " + profiles.front().runtime +
                      "; profile every stage for the runtime the job runs (remat.pipelining.profile_stage for "
                      "PyTorch's, remat::pipeline::profile_stage for remat::pipeline's)");
    }
    if (profile.model != profiles.front().model) {
      throw PlanError("the profile of stage " + std::to_string(s) + " is of model '" + profile.model +
                      "' and that of stage 0 of model '" + profiles.front().model +
                      "'; profile every stage of one model (the same model= in profile_stage)");
    }
    if (s > 0) {
      const StageProfile& previous = profiles[static_cast<std::size_t>(s - 1)];
      if (previous.output_bytes != profile.input_bytes) {
        throw PlanError("stage " + std::to_string(s - 1) + " sends " + bytes_text(previous.output_bytes) +
                        " per microbatch and stage " + std::to_string(s) + " receives " +
                        bytes_text(profile.input_bytes) +
                        ": the profiles are not of one model split at one place with one microbatch size; profile "
                        "every stage again from the same model and microbatch");
      }
    }
  }
}

// Receive buffers each rank holds for the step: per stage and direction, stock sets or rings.
std::vector<std::uint64_t> receive_bytes(const Schedule& lowered, const std::vector<StageProfile>& profiles,
                                         const PredictOptions& options) {
  PlanOptions plan_options;
  plan_options.schedule_name = options.schedule_name;
  plan_options.lowering = options.lowering;
  if (profiles.front().runtime == kRematRuntime) {
    plan_options.slack = options.slack;  // PipelineRuntime plans with its slack and NeMo's ring where safe
  } else {
    plan_options.use_closed_form = false;
    plan_options.spare_sets = options.spare_sets;
  }
  const PipelinePlan plan = plan_receive_buffers(lowered, plan_options);
  std::vector<std::uint64_t> per_rank(static_cast<std::size_t>(lowered.num_ranks()), 0);
  for (const StagePlan& entry : plan.entries) {
    if (entry.received == 0) continue;
    const StageProfile& profile = profiles[static_cast<std::size_t>(entry.stage)];
    const std::uint64_t set_bytes =
        entry.direction == Direction::forward ? profile.input_bytes : profile.output_bytes;
    const int sets = options.buffers == ReceiveBuffers::stock ? entry.stock_sets() : entry.pooled_sets();
    const std::string what =
        figure_text(entry.stage, entry.direction == Direction::forward ? "input_bytes" : "output_bytes") + " x " +
        std::to_string(sets) + " receive buffer sets";
    std::uint64_t& bytes = per_rank[static_cast<std::size_t>(entry.rank)];
    bytes = checked_add(bytes, checked_times(set_bytes, static_cast<std::uint64_t>(sets), entry.rank, what), entry.rank,
                        what);
  }
  return per_rank;
}

// One rank's walk.
class RankWalk {
 public:
  RankWalk(const Schedule& lowered, const std::vector<StageProfile>& profiles, const PredictOptions& options, int rank,
           std::uint64_t receive)
      : order_(lowered.ranks[static_cast<std::size_t>(rank)]),
        profiles_(profiles),
        options_(options),
        last_stage_(lowered.num_stages() - 1),
        microbatches_(lowered.microbatches),
        remat_runtime_(profiles.front().runtime == kRematRuntime),
        sends_held_to_end_(remat_runtime_ || options.lowering != "step" || options.schedule_name != "1f1b"),
        stock_handoffs_(!remat_runtime_ && options.buffers == ReceiveBuffers::stock) {
    result_.rank = rank;
    for (int s = 0; s < lowered.num_stages(); ++s) {
      if (lowered.stage_to_rank[static_cast<std::size_t>(s)] == rank) result_.stages.push_back(s);
    }
    level_.receive_buffers = receive;
    const auto m = static_cast<std::uint64_t>(microbatches_);
    hold_previous_handoffs();
    for (const int s : result_.stages) {
      const StageProfile& p = profile(s);
      add(&PeakParts::params, p.params, figure_text(s, "params"));
      if (options.optimizer_step)
        add(&PeakParts::optimizer_state, p.optimizer_state, figure_text(s, "optimizer_state"));
      if (s == 0)
        add(&PeakParts::batch, times(p.input_bytes, m, s, "input_bytes"),
            figure_text(s, "input_bytes") + " x microbatches");
      if (s == last_stage_) {
        add(&PeakParts::batch, times(p.target_bytes, m, s, "target_bytes"),
            figure_text(s, "target_bytes") + " x microbatches");
      }
    }
    for (const std::optional<Action>& action : order_) {
      if (!action || !action->microbatch) continue;
      if (action->type == ActionType::send_f) sends_forward_.insert({action->stage, *action->microbatch});
      if (action->type == ActionType::send_b) sends_backward_.insert({action->stage, *action->microbatch});
    }
  }

  RankPrediction run() {
    for (std::size_t position = 0; position < order_.size(); ++position) {
      if (order_[position]) step(*order_[position], static_cast<int>(position));
    }
    finish();
    return result_;
  }

 private:
  using Key = std::pair<int, int>;  // stage, microbatch

  const StageProfile& profile(int stage) const { return profiles_[static_cast<std::size_t>(stage)]; }

  bool runs_here(int stage) const {
    return std::find(result_.stages.begin(), result_.stages.end(), stage) != result_.stages.end();
  }

  // PyTorch's runtime hands this stage's output to the next stage on this rank (a V's turn).
  bool hands_on(int stage) const { return !remat_runtime_ && stage < last_stage_ && runs_here(stage + 1); }

  // Stock: what the previous step handed between the V's two stages, one set per microbatch and
  // direction, still in the receiving stages' records when this step begins.
  void hold_previous_handoffs() {
    if (!stock_handoffs_) return;
    const auto m = static_cast<std::uint64_t>(microbatches_);
    for (const int s : result_.stages) {
      if (!hands_on(s)) continue;
      add(&PeakParts::receive_buffers, times(profile(s).output_bytes, m, s, "output_bytes"),
          figure_text(s, "output_bytes") + " x microbatches handed on");
      add(&PeakParts::receive_buffers, times(profile(s + 1).input_grad_bytes, m, s + 1, "input_grad_bytes"),
          figure_text(s + 1, "input_grad_bytes") + " x microbatches handed back");
      for (int mb = 0; mb < microbatches_; ++mb) previous_handoffs_.insert({s, mb});
    }
  }

  // Adds bytes to one part of the level, refusing a sum past 2^64 - 1 (of the part or the level).
  void add(std::uint64_t PeakParts::*part, std::uint64_t bytes, const std::string& what) {
    checked_add(level_.total(), bytes, result_.rank, what);
    level_.*part += bytes;
  }

  std::uint64_t times(std::uint64_t bytes, std::uint64_t count, int stage, const char* figure) const {
    return checked_times(bytes, count, result_.rank, figure_text(stage, figure) + " x " + std::to_string(count));
  }

  void candidate(std::uint64_t transient, int position, std::string action, const std::string& what) {
    PeakParts parts = level_;
    parts.transient = transient;
    const std::uint64_t total = checked_add(level_.total(), transient, result_.rank, what + " at " + action);
    if (!seen_ || total > result_.peak) {
      seen_ = true;
      result_.peak = total;
      result_.parts = parts;
      result_.position = position;
      result_.action = std::move(action);
      result_.in_flight = static_cast<int>(in_flight_.size());
    }
  }

  void grads_of(int stage) {
    if (graded_.insert(stage).second) add(&PeakParts::grads, profile(stage).grads, figure_text(stage, "grads"));
  }

  // A full backward's peak above the level: the step's first on a stage creates the gradients.
  std::pair<std::uint64_t, const char*> backward_transient_of(int stage) const {
    const StageProfile& p = profile(stage);
    if (graded_.count(stage) == 0 && p.first_backward_transient) {
      return {*p.first_backward_transient, "first_backward_transient"};
    }
    return {p.backward_transient, "backward_transient"};
  }

  // The microbatch's activations let go; its output stays where something still holds it.
  void release_forward(int stage, int microbatch, std::uint64_t kept) {
    level_.activations -= kept;
    in_flight_.erase({stage, microbatch});
    hold_outputs(stage, microbatch, kept);
    if (hands_on(stage)) hold_handed_output(stage, microbatch, kept);
  }

  // The output handed to the next stage on this rank outlives this stage's backward: stock, in
  // the next stage's records until the next step's forward of the microbatch replaces it;
  // pooled, until the next stage's backward of the microbatch is done, or the step's end where
  // that stage's sent output pins it.
  void hold_handed_output(int stage, int microbatch, std::uint64_t kept) {
    const std::uint64_t bytes = std::min(profile(stage).output_bytes, kept);
    const std::string what = figure_text(stage, "output_bytes") + " handed on";
    if (stock_handoffs_) {
      add(&PeakParts::receive_buffers, bytes, what);
    } else if (backward_done_.count({stage + 1, microbatch}) == 0) {
      add(&PeakParts::held_for_sends, bytes, what);
      handed_outputs_[{stage + 1, microbatch}] += bytes;
    } else if (pinned_inputs_.count({stage + 1, microbatch}) > 0) {
      add(&PeakParts::held_for_sends, bytes, what);
    }
  }

  // A full B leaves the stage's autograd graph to whatever holds its output: a sent output,
  // held by its send until the step's end, keeps the graph's nodes and through its
  // AccumulateGrad the input leaf, here an output handed on by the stage before (I detaches
  // the output and lets them go).
  void pin_handed_input(int stage, int microbatch) {
    if (stage == 0 || !hands_on(stage - 1) || !sends_held_to_end_) return;
    if (sends_forward_.count({stage, microbatch}) > 0) pinned_inputs_.insert({stage, microbatch});
  }

  // Stock: this step's forward replaces the output the previous step handed on for the microbatch.
  void replace_handed_output(int stage, int microbatch) {
    if (previous_handoffs_.erase({stage, microbatch}) > 0) level_.receive_buffers -= profile(stage).output_bytes;
  }

  // The stage's backward of the microbatch is done (B, or W after I): what it held of a handoff
  // on this rank, and what it made a reader of, may be let go.
  void backward_done(int stage, int microbatch) {
    backward_done_.insert({stage, microbatch});
    const auto output = handed_outputs_.find({stage, microbatch});
    if (output != handed_outputs_.end() && pinned_inputs_.count({stage, microbatch}) == 0) {
      level_.held_for_sends -= output->second;
      handed_outputs_.erase(output);
    }
    release_local_grad(stage, microbatch);
    release_local_grad(stage - 1, microbatch);
  }

  // What outlives the microbatch's forward state, once: a sent output its send still holds, the
  // last stage's output and loss. remat::pipeline drops the forward state at I, PyTorch at W.
  void hold_outputs(int stage, int microbatch, std::uint64_t kept) {
    if (!outputs_held_.insert({stage, microbatch}).second) return;
    const StageProfile& p = profile(stage);
    const bool held_by_send = sends_held_to_end_ && sends_forward_.count({stage, microbatch}) > 0;
    if (stage == last_stage_) {
      add(&PeakParts::held_for_sends, p.loss_bytes, figure_text(stage, "loss_bytes"));
      if (!remat_runtime_) add(&PeakParts::held_for_sends, p.output_bytes, figure_text(stage, "output_bytes"));
    } else if (held_by_send) {
      add(&PeakParts::held_for_sends, std::min(p.output_bytes, kept), figure_text(stage, "output_bytes"));
    }
  }

  // The input gradient a backward (B, or I where `input_only`) made. remat::pipeline keeps it
  // until the step's end. Under PyTorch's runtime a sent one is held until its send is waited
  // for, or, after I, by the input leaf's .grad until the next step; a handed one (stock)
  // replaces the previous step's in the previous stage's records, or (pooled) is held until the
  // previous stage's backward is done and, after I, this stage's W.
  void hold_input_grad(int stage, int microbatch, bool input_only) {
    const std::uint64_t bytes = profile(stage).input_grad_bytes;
    if (stage == 0 || bytes == 0) return;
    const std::string what = figure_text(stage, "input_grad_bytes");
    if (remat_runtime_) {
      add(&PeakParts::held_for_sends, bytes, what);
      return;
    }
    const bool sent = sends_backward_.count({stage, microbatch}) > 0;
    if (sent) {
      add(&PeakParts::held_for_sends, bytes, what);
      if (input_only) {
        kept_past_step_ = checked_add(kept_past_step_, bytes, result_.rank, what + " kept as .grad");
      } else if (!sends_held_to_end_) {
        waited_at_send_[{stage, microbatch}] += bytes;
      }
      return;
    }
    if (stock_handoffs_) return;
    add(&PeakParts::held_for_sends, bytes, what + " handed back");
    local_grads_[{stage - 1, microbatch}] = {bytes, input_only};
  }

  // A gradient handed back to `stage` is let go once its readers are done with it.
  void release_local_grad(int stage, int microbatch) {
    const auto it = local_grads_.find({stage, microbatch});
    if (it == local_grads_.end() || backward_done_.count({stage, microbatch}) == 0) return;
    if (it->second.until_weight_of_next && backward_done_.count({stage + 1, microbatch}) == 0) return;
    level_.held_for_sends -= it->second.bytes;
    local_grads_.erase(it);
  }

  void step(const Action& action, int position) {
    if (action.type == ActionType::overlap_f_b) {
      for (const Action& sub : action.sub_actions) step(sub, position);
      return;
    }
    if (!action.microbatch) return;
    const int s = action.stage;
    const int m = *action.microbatch;
    const StageProfile& p = profile(s);
    switch (action.type) {
      case ActionType::forward:
        candidate(p.forward_transient, position, to_string(action), figure_text(s, "forward_transient"));
        add(&PeakParts::activations, p.forward_kept, figure_text(s, "forward_kept"));
        kept_[{s, m}] = p.forward_kept;
        in_flight_.insert({s, m});
        replace_handed_output(s, m);
        break;
      case ActionType::full_backward: {
        const auto [transient, figure] = backward_transient_of(s);
        candidate(transient, position, to_string(action), figure_text(s, figure));
        grads_of(s);
        release_forward(s, m, take_kept(s, m));
        hold_input_grad(s, m, false);
        if (remat_runtime_) break;
        pin_handed_input(s, m);
        backward_done(s, m);
        break;
      }
      case ActionType::backward_input:
        if (s == 0 && !remat_runtime_) break;  // PyTorch runs stage 0's whole backward at W
        candidate(p.input_backward_transient, position, to_string(action), figure_text(s, "input_backward_transient"));
        {
          const std::uint64_t forward_kept = take_kept(s, m);
          add(&PeakParts::activations, p.input_backward_kept, figure_text(s, "input_backward_kept"));
          level_.activations -= forward_kept;
          if (remat_runtime_) hold_outputs(s, m, forward_kept);
        }
        kept_[{s, m}] = p.input_backward_kept;
        hold_input_grad(s, m, true);
        break;
      case ActionType::backward_weight: {
        const auto [transient, figure] =
            s == 0 && !remat_runtime_
                ? backward_transient_of(s)
                : std::pair<std::uint64_t, const char*>{p.weight_backward_transient, "weight_backward_transient"};
        candidate(transient, position, to_string(action), figure_text(s, figure));
        grads_of(s);
        release_forward(s, m, take_kept(s, m));
        if (!remat_runtime_) backward_done(s, m);
        break;
      }
      case ActionType::send_b: {
        const auto it = waited_at_send_.find({s, m});
        if (it != waited_at_send_.end()) {
          level_.held_for_sends -= it->second;
          waited_at_send_.erase(it);
        }
        break;
      }
      default:
        break;
    }
  }

  std::uint64_t take_kept(int stage, int microbatch) {
    const auto it = kept_.find({stage, microbatch});
    if (it == kept_.end()) return 0;
    const std::uint64_t kept = it->second;
    kept_.erase(it);
    return kept;
  }

  void finish() {
    // The step's sends are waited for; the last stage keeps its outputs and losses (PyTorch) or
    // its losses (remat::pipeline, step()'s result).
    std::uint64_t last_outputs = 0;
    const bool has_last = std::find(result_.stages.begin(), result_.stages.end(), last_stage_) != result_.stages.end();
    const auto m = static_cast<std::uint64_t>(microbatches_);
    if (has_last) {
      const StageProfile& p = profile(last_stage_);
      last_outputs = times(p.loss_bytes, m, last_stage_, "loss_bytes");
      if (!remat_runtime_) {
        last_outputs = checked_add(last_outputs, times(p.output_bytes, m, last_stage_, "output_bytes"), result_.rank,
                                   figure_text(last_stage_, "output_bytes") + " x microbatches");
      }
    }
    level_.held_for_sends = 0;
    add(&PeakParts::held_for_sends, last_outputs, figure_text(last_stage_, "outputs and losses"));
    add(&PeakParts::held_for_sends, kept_past_step_, "the input gradients kept as .grad until the next step");
    if (has_last && !remat_runtime_) {
      candidate(times(profile(last_stage_).output_bytes, m, last_stage_, "output_bytes"), -1, "merge outputs",
                figure_text(last_stage_, "output_bytes"));
    }
    if (!options_.optimizer_step) return;
    std::uint64_t transient = 0;
    for (const int s : result_.stages) {
      grads_of(s);
      transient =
          checked_add(transient, profile(s).optimizer_transient, result_.rank, figure_text(s, "optimizer_transient"));
    }
    candidate(transient, -1, "optimizer step", "the optimizer_transient");
  }

  const RankOrder& order_;
  const std::vector<StageProfile>& profiles_;
  const PredictOptions& options_;
  const int last_stage_;
  const int microbatches_;
  const bool remat_runtime_;
  // Every send's tensor is held until the step's end: all but Schedule1F1B's own loop.
  const bool sends_held_to_end_;
  // PyTorch's runtime with stock buffers: what the V's turn hands on stays until the next step.
  const bool stock_handoffs_;
  PeakParts level_;
  RankPrediction result_;
  bool seen_ = false;
  std::set<Key> sends_forward_;
  std::set<Key> sends_backward_;
  std::set<Key> in_flight_;
  std::set<Key> outputs_held_;
  std::set<int> graded_;
  std::map<Key, std::uint64_t> kept_;
  // A gradient handed back to a stage on this rank, pooled: let go after that stage's backward
  // and, where I made it (the leaf's .grad), after the next stage's W.
  struct HandedGrad {
    std::uint64_t bytes = 0;
    bool until_weight_of_next = false;
  };
  std::map<Key, HandedGrad> local_grads_;
  std::map<Key, std::uint64_t> handed_outputs_;  // pooled, by receiving stage: until its backward is done
  std::set<Key> previous_handoffs_;              // stock: the previous step's outputs handed on, by handing stage
  std::set<Key> backward_done_;
  std::set<Key> pinned_inputs_;  // handed inputs a sent output keeps until the step's end, by receiving stage
  std::map<Key, std::uint64_t> waited_at_send_;
  std::uint64_t kept_past_step_ = 0;  // received inputs' .grad after I, until the next step
};

}  // namespace

std::uint64_t PeakParts::total() const {
  return params + grads + optimizer_state + activations + receive_buffers + held_for_sends + batch + transient;
}

std::string_view to_string(ReceiveBuffers buffers) { return buffers == ReceiveBuffers::stock ? "stock" : "pooled"; }

Prediction predict_peaks(const Schedule& lowered, const std::vector<StageProfile>& profiles,
                         const PredictOptions& options) {
  if (lowered.microbatches < 1) {
    throw PlanError("microbatches is " + std::to_string(lowered.microbatches) +
                    "; a step runs 1 or more microbatches");
  }
  check_profiles(lowered, profiles);
  const std::vector<std::uint64_t> receive = receive_bytes(lowered, profiles, options);
  Prediction prediction;
  prediction.model = profiles.front().model;
  prediction.runtime = profiles.front().runtime;
  detail::record_schedule(prediction, options, lowered);
  prediction.buffers = options.buffers;
  for (int rank = 0; rank < lowered.num_ranks(); ++rank) {
    prediction.per_rank.push_back(
        RankWalk(lowered, profiles, options, rank, receive[static_cast<std::size_t>(rank)]).run());
  }
  return prediction;
}

}  // namespace remat::pipeline
