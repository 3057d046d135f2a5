#include <remat/pipeline/runtime.hpp>

#include <remat/pipeline/errors.hpp>

#include "runtime/rank_agreement.hpp"
#include "runtime/receive_ring.hpp"

#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace remat::pipeline {
namespace {

// What one stage keeps for one microbatch between its actions in a step.
struct MicrobatchState {
  at::Tensor input;        // stages after the first: a leaf over the receive buffer or the local handoff
  at::Tensor output;       // the stage's output, with its graph until backward
  at::Tensor loss;         // last stage only, with its graph until backward
  at::Tensor loss_value;   // last stage only, what step() returns
  at::Tensor grad_output;  // handed over by the next stage on this rank
  at::Tensor input_grad;   // for the previous stage, after B or I
  std::vector<at::Tensor> weight_grads;  // from I until W, one per parameter (undefined: none)
  Transfer forward_receive;
  Transfer backward_receive;
};

struct LocalStage {
  StageModule module;
  std::optional<int> previous_rank;  // where activations come from; nullopt for the first stage
  std::optional<int> next_rank;      // where gradients come from; nullopt for the last stage
  std::unique_ptr<detail::ReceiveRing> forward_ring;
  std::unique_ptr<detail::ReceiveRing> backward_ring;
  std::vector<MicrobatchState> microbatches;

  // `tensor`, or a copy where it is a view of one of this stage's receive buffers (a stage that
  // passes its input through): what leaves the stage, a send in flight or a handover, must not
  // pin a slot that the ring hands out again.
  at::Tensor apart_from_rings(const at::Tensor& tensor) const {
    const bool aliased =
        (forward_ring && forward_ring->aliases(tensor)) || (backward_ring && backward_ring->aliases(tensor));
    return aliased ? tensor.clone() : tensor;
  }
};

// The action being run, for error messages: formatted only when one is thrown.
struct ActionSite {
  int rank = 0;
  std::size_t position = 0;
  const Action& action;
};

std::string operator+(const ActionSite& site, std::string_view text) {
  return "rank " + std::to_string(site.rank) + ", position " + std::to_string(site.position) + " (" +
         to_string(site.action) + ")" + std::string(text);
}

}  // namespace

struct PipelineRuntime::Impl {
  std::shared_ptr<Communicator> communicator;
  Schedule schedule;
  RuntimeOptions options;
  LossFunction loss;
  PipelinePlan plan;
  std::map<int, LocalStage> stages;  // by stage index
  // Buffers whose last reader is at this position of the rank's order: (stage, direction, microbatch).
  std::map<std::size_t, std::vector<std::tuple<int, Direction, int>>> releases;
  std::vector<Transfer> sends;

  int rank() const { return communicator->rank(); }
  int microbatches() const { return schedule.microbatches; }
  int tag(int receiving_stage, Direction direction, int microbatch) const {
    return (receiving_stage * 2 + (direction == Direction::backward ? 1 : 0)) * microbatches() + microbatch;
  }
  LocalStage& stage(int index, const ActionSite& where) {
    const auto found = stages.find(index);
    if (found == stages.end()) throw RuntimeError(where + ": stage " + std::to_string(index) + " is not on this rank");
    return found->second;
  }
  MicrobatchState& state(LocalStage& stage, int microbatch, const ActionSite& where) {
    if (microbatch < 0 || microbatch >= microbatches()) {
      throw RuntimeError(where + ": microbatch " + std::to_string(microbatch) + " is outside 0.." +
                         std::to_string(microbatches() - 1));
    }
    return stage.microbatches[static_cast<std::size_t>(microbatch)];
  }

  void check_fits_schedule(const std::vector<StageModule>& given) const;
  void build_rings();
  void run(const Action& action, std::size_t position, const std::vector<at::Tensor>& inputs,
           const std::vector<at::Tensor>& targets);
  void forward(LocalStage& stage, int microbatch, const ActionSite& where, const std::vector<at::Tensor>& inputs,
               const std::vector<at::Tensor>& targets);
  void backward(LocalStage& stage, int microbatch, bool input_only, const ActionSite& where);
  void backward_weight(LocalStage& stage, int microbatch, const ActionSite& where);
  void send(LocalStage& stage, Direction direction, int microbatch, const ActionSite& where);
  void receive(LocalStage& stage, Direction direction, int microbatch, const ActionSite& where);
};

void PipelineRuntime::Impl::check_fits_schedule(const std::vector<StageModule>& given) const {
  if (schedule.num_ranks() != communicator->world_size()) {
    throw RuntimeError("the schedule has " + std::to_string(schedule.num_ranks()) + " ranks but the job has WORLD_SIZE=" +
                       std::to_string(communicator->world_size()) + "; start one process per schedule rank");
  }
  std::set<int> expected;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    if (schedule.stage_to_rank[static_cast<std::size_t>(s)] == rank()) expected.insert(s);
  }
  std::set<int> got;
  for (const auto& module : given) {
    if (!got.insert(module.stage).second) {
      throw RuntimeError("rank " + std::to_string(rank()) + " was given stage " + std::to_string(module.stage) + " twice");
    }
    if (!module.forward) throw RuntimeError("stage " + std::to_string(module.stage) + " has no forward function");
  }
  if (got != expected) {
    auto list = [](const std::set<int>& indices) {
      std::string text;
      for (int s : indices) text += (text.empty() ? "" : ", ") + std::to_string(s);
      return "{" + text + "}";
    };
    throw RuntimeError("rank " + std::to_string(rank()) + " runs stages " + list(expected) + " of this schedule (" +
                       std::to_string(schedule.num_stages()) + " stages over " + std::to_string(schedule.num_ranks()) +
                       " ranks) but was given stages " + list(got));
  }
  if (options.activation_shape.empty() && schedule.num_stages() > 1) {
    throw RuntimeError("RuntimeOptions::activation_shape is empty: give the shape of one microbatch's activation at "
                       "the stage boundaries, which the receive buffers hold");
  }
  if (options.rings_below_minimum < 0) {
    throw RuntimeError("RuntimeOptions::rings_below_minimum is " + std::to_string(options.rings_below_minimum) +
                       "; it must be >= 0");
  }
}

void PipelineRuntime::Impl::build_rings() {
  for (const StagePlan& entry : plan.entries) {
    if (entry.rank != rank() || !entry.ring_size) continue;
    LocalStage& local = stages.at(entry.stage);
    std::vector<std::optional<int>> slots = entry.slots;
    int size = 0;
    if (options.buffers == BufferMode::stock) {
      for (std::size_t m = 0; m < slots.size(); ++m) {
        if (slots[m]) slots[m] = static_cast<int>(m);
      }
      size = microbatches();
    } else if (options.rings_below_minimum > 0) {
      size = std::max(1, entry.min_slots - options.rings_below_minimum);
    } else {
      size = *entry.ring_size;
    }
    auto ring = std::make_unique<detail::ReceiveRing>(entry.stage, entry.direction, std::move(slots), size,
                                                      options.activation_shape, options.dtype, options.device,
                                                      options.ownership_guard);
    (entry.direction == Direction::forward ? local.forward_ring : local.backward_ring) = std::move(ring);
  }
  const BufferAnalysis analysis = analyze_receive_buffers(schedule);
  for (const StageBuffers& buffers : analysis.stages) {
    if (buffers.rank != rank()) continue;
    for (const LiveInterval& interval : buffers.intervals) {
      releases[static_cast<std::size_t>(interval.end)].emplace_back(buffers.stage, buffers.direction,
                                                                     interval.microbatch);
    }
  }
}

PipelineRuntime::PipelineRuntime(std::shared_ptr<Communicator> communicator, Schedule lowered, RuntimeOptions options,
                                 std::vector<StageModule> stages, LossFunction loss)
    : impl_(std::make_unique<Impl>()) {
  if (!communicator) throw RuntimeError("PipelineRuntime needs a communicator (Communicator::connect)");
  if (!loss) throw RuntimeError("PipelineRuntime needs a loss function for the last stage");
  impl_->communicator = std::move(communicator);
  impl_->schedule = std::move(lowered);
  impl_->options = std::move(options);
  impl_->loss = std::move(loss);
  impl_->check_fits_schedule(stages);
  detail::agree_across_ranks(*impl_->communicator, impl_->schedule, impl_->options);
  PlanOptions plan_options;
  plan_options.schedule_name = impl_->options.schedule_name;
  plan_options.slack = impl_->options.slack;
  impl_->plan = plan_receive_buffers(impl_->schedule, plan_options);
  const int last_stage = impl_->schedule.num_stages() - 1;
  for (auto& module : stages) {
    LocalStage local;
    const int s = module.stage;
    if (s > 0) local.previous_rank = impl_->schedule.stage_to_rank[static_cast<std::size_t>(s - 1)];
    if (s < last_stage) local.next_rank = impl_->schedule.stage_to_rank[static_cast<std::size_t>(s + 1)];
    local.module = std::move(module);
    impl_->stages.emplace(s, std::move(local));
  }
  impl_->build_rings();
}

PipelineRuntime::~PipelineRuntime() {
  // Sends still in flight read tensors this object owns.
  for (auto& transfer : impl_->sends) {
    try {
      transfer.wait();
    } catch (const RuntimeError&) {  // the step that started them already failed
    }
  }
}

const PipelinePlan& PipelineRuntime::plan() const { return impl_->plan; }

int PipelineRuntime::buffer_sets(int stage, Direction direction) const {
  const auto found = impl_->stages.find(stage);
  if (found == impl_->stages.end()) return 0;
  const auto& ring = direction == Direction::forward ? found->second.forward_ring : found->second.backward_ring;
  return ring ? ring->size() : 0;
}

void PipelineRuntime::Impl::receive(LocalStage& stage, Direction direction, int microbatch, const ActionSite& where) {
  const bool forward = direction == Direction::forward;
  auto& ring = forward ? stage.forward_ring : stage.backward_ring;
  const auto peer = forward ? stage.previous_rank : stage.next_rank;
  if (!ring || !peer) throw RuntimeError(where + ": stage " + std::to_string(stage.module.stage) + " receives nothing there");
  MicrobatchState& mb = state(stage, microbatch, where);
  const at::Tensor buffer = ring->acquire(microbatch);
  (forward ? mb.forward_receive : mb.backward_receive) =
      communicator->receive(buffer, *peer, tag(stage.module.stage, direction, microbatch));
  (forward ? mb.input : mb.grad_output) = buffer;
}

void PipelineRuntime::Impl::send(LocalStage& stage, Direction direction, int microbatch, const ActionSite& where) {
  const bool forward = direction == Direction::forward;
  const auto peer = forward ? stage.next_rank : stage.previous_rank;
  if (!peer) throw RuntimeError(where + ": stage " + std::to_string(stage.module.stage) + " has no neighbour to send to");
  MicrobatchState& mb = state(stage, microbatch, where);
  const at::Tensor& value = forward ? mb.output : mb.input_grad;
  if (!value.defined()) {
    throw RuntimeError(where + ": nothing to send yet (the " + std::string(forward ? "F" : "B or I") +
                       " for this microbatch has not run on this rank)");
  }
  if (!value.sizes().equals(options.activation_shape) || value.scalar_type() != options.dtype) {
    throw RuntimeError(where + ": stage " + std::to_string(stage.module.stage) + " has a " +
                       std::string(forward ? "forward output" : "input gradient") + " of shape " +
                       c10::str(value.sizes()) + " and type " + std::string(c10::toString(value.scalar_type())) +
                       " but the receive buffers hold " + c10::str(at::IntArrayRef(options.activation_shape)) + " " +
                       std::string(c10::toString(options.dtype)) +
                       "; set RuntimeOptions::activation_shape and dtype to what the stages produce");
  }
  const int receiving_stage = stage.module.stage + (forward ? 1 : -1);
  sends.push_back(
      communicator->send(stage.apart_from_rings(value.detach().contiguous()), *peer,
                         tag(receiving_stage, direction, microbatch)));
}

void PipelineRuntime::Impl::forward(LocalStage& stage, int microbatch, const ActionSite& where,
                                    const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets) {
  MicrobatchState& mb = state(stage, microbatch, where);
  const int s = stage.module.stage;
  at::Tensor input;
  if (s == 0) {
    input = inputs[static_cast<std::size_t>(microbatch)];
  } else {
    if (!mb.input.defined()) throw RuntimeError(where + ": the stage's input for this microbatch was never received");
    mb.forward_receive.wait();
    // A leaf of its own per microbatch over the (possibly shared) buffer: its gradient is what
    // goes back to the previous stage.
    mb.input = mb.input.detach().requires_grad_(true);
    input = mb.input;
  }
  mb.output = stage.module.forward(input);
  if (!mb.output.defined()) throw RuntimeError(where + ": stage " + std::to_string(s) + "'s forward returned no tensor");
  if (s == schedule.num_stages() - 1) {
    mb.loss = loss(mb.output, targets[static_cast<std::size_t>(microbatch)]);
    mb.loss_value = mb.loss.detach();
  } else if (stage.next_rank == rank()) {  // the next stage is on this rank: hand over directly
    LocalStage& next = this->stage(s + 1, where);
    next.microbatches[static_cast<std::size_t>(microbatch)].input = stage.apart_from_rings(mb.output.detach());
  }
}

void PipelineRuntime::Impl::backward(LocalStage& stage, int microbatch, bool input_only, const ActionSite& where) {
  MicrobatchState& mb = state(stage, microbatch, where);
  const int s = stage.module.stage;
  if (!mb.output.defined()) throw RuntimeError(where + ": backward before the microbatch's forward on this stage");
  at::Tensor root = mb.output;
  at::Tensor grad_root;
  if (mb.loss.defined()) {
    root = mb.loss;
  } else {
    if (!mb.grad_output.defined()) {
      throw RuntimeError(where + ": the gradient of the stage's output for this microbatch was never received");
    }
    mb.backward_receive.wait();
    grad_root = mb.grad_output;
  }
  const bool wants_input_grad = s > 0;
  if (input_only) {
    // Input and weight gradients in one pass; W adds the weight part to the parameters later.
    std::vector<at::Tensor> wrt;
    if (wants_input_grad) wrt.push_back(mb.input);
    std::vector<std::size_t> trained;  // parameters that require grad, by index
    for (std::size_t i = 0; i < stage.module.parameters.size(); ++i) {
      if (stage.module.parameters[i].requires_grad()) {
        trained.push_back(i);
        wrt.push_back(stage.module.parameters[i]);
      }
    }
    const auto grads = torch::autograd::grad({root}, wrt, {grad_root}, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    if (wants_input_grad) mb.input_grad = grads.front();
    mb.weight_grads.assign(stage.module.parameters.size(), at::Tensor());
    for (std::size_t k = 0; k < trained.size(); ++k) {
      mb.weight_grads[trained[k]] = grads[k + (wants_input_grad ? 1 : 0)];
    }
  } else {
    torch::autograd::backward({root}, {grad_root});
    if (wants_input_grad) mb.input_grad = mb.input.grad();
  }
  if (wants_input_grad && !mb.input_grad.defined()) mb.input_grad = at::zeros_like(mb.input);
  if (wants_input_grad) mb.input_grad = stage.apart_from_rings(mb.input_grad);
  if (wants_input_grad && stage.previous_rank == rank()) {
    this->stage(s - 1, where).microbatches[static_cast<std::size_t>(microbatch)].grad_output = mb.input_grad;
  }
  mb.output = at::Tensor();
  mb.loss = at::Tensor();
  mb.grad_output = at::Tensor();
  // An input handed over on this rank has no receive slot whose release would drop it.
  if (s > 0 && stage.previous_rank == rank()) mb.input = at::Tensor();
}

void PipelineRuntime::Impl::backward_weight(LocalStage& stage, int microbatch, const ActionSite& where) {
  MicrobatchState& mb = state(stage, microbatch, where);
  if (mb.weight_grads.size() != stage.module.parameters.size()) {
    throw RuntimeError(where + ": W before the microbatch's I on this stage");
  }
  for (std::size_t i = 0; i < mb.weight_grads.size(); ++i) {
    at::Tensor& grad = stage.module.parameters[i].mutable_grad();
    const at::Tensor& update = mb.weight_grads[i];
    if (!update.defined()) continue;
    if (grad.defined()) {
      grad.add_(update);
    } else {
      grad = update;
    }
  }
  mb.weight_grads.clear();
}

void PipelineRuntime::Impl::run(const Action& action, std::size_t position, const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& targets) {
  const ActionSite where{rank(), position, action};
  if (action.type == ActionType::overlap_f_b) {
    for (const Action& inner : action.sub_actions) run(inner, position, inputs, targets);
    return;
  }
  if (!action.microbatch) return;  // UNSHARD, RESHARD, REDUCE_GRAD: nothing to shard or reduce here
  LocalStage& local = stage(action.stage, where);
  const int m = *action.microbatch;
  switch (action.type) {
    case ActionType::forward: forward(local, m, where, inputs, targets); break;
    case ActionType::full_backward: backward(local, m, /*input_only=*/false, where); break;
    case ActionType::backward_input: backward(local, m, /*input_only=*/true, where); break;
    case ActionType::backward_weight: backward_weight(local, m, where); break;
    case ActionType::send_f: send(local, Direction::forward, m, where); break;
    case ActionType::send_b: send(local, Direction::backward, m, where); break;
    case ActionType::recv_f: receive(local, Direction::forward, m, where); break;
    case ActionType::recv_b: receive(local, Direction::backward, m, where); break;
    default: break;
  }
}

std::vector<at::Tensor> PipelineRuntime::step(const std::vector<at::Tensor>& inputs,
                                              const std::vector<at::Tensor>& targets) {
  Impl& impl = *impl_;
  const auto m = static_cast<std::size_t>(impl.microbatches());
  const bool first_here = impl.stages.count(0) != 0;
  const int last_stage = impl.schedule.num_stages() - 1;
  const bool last_here = impl.stages.count(last_stage) != 0;
  if (first_here && inputs.size() != m) {
    throw RuntimeError("rank " + std::to_string(impl.rank()) + " runs the first stage and needs " + std::to_string(m) +
                       " input microbatches; got " + std::to_string(inputs.size()));
  }
  if (last_here && targets.size() != m) {
    throw RuntimeError("rank " + std::to_string(impl.rank()) + " runs the last stage and needs " + std::to_string(m) +
                       " target microbatches; got " + std::to_string(targets.size()));
  }
  for (auto& [index, local] : impl.stages) local.microbatches.assign(m, MicrobatchState{});

  const RankOrder& order = impl.schedule.ranks[static_cast<std::size_t>(impl.rank())];
  for (std::size_t position = 0; position < order.size(); ++position) {
    if (order[position]) impl.run(*order[position], position, inputs, targets);
    const auto released = impl.releases.find(position);
    if (released == impl.releases.end()) continue;
    for (const auto& [stage_index, direction, microbatch] : released->second) {
      LocalStage& local = impl.stages.at(stage_index);
      MicrobatchState& mb = local.microbatches[static_cast<std::size_t>(microbatch)];
      (direction == Direction::forward ? mb.input : mb.grad_output) = at::Tensor();
      (direction == Direction::forward ? local.forward_ring : local.backward_ring)->release(microbatch);
    }
  }
  for (auto& transfer : impl.sends) transfer.wait();
  impl.sends.clear();

  std::vector<at::Tensor> losses;
  for (auto& [index, local] : impl.stages) {
    if (local.forward_ring && impl.options.ownership_guard) local.forward_ring->expect_all_released();
    if (local.backward_ring && impl.options.ownership_guard) local.backward_ring->expect_all_released();
    for (auto& mb : local.microbatches) {
      if (index == last_stage) losses.push_back(mb.loss_value);
    }
    if (impl.options.scale_grads) {
      for (auto& parameter : local.module.parameters) {
        if (parameter.grad().defined()) parameter.mutable_grad().div_(static_cast<double>(m));
      }
    }
    local.microbatches.clear();
  }
  return losses;
}

}  // namespace remat::pipeline
