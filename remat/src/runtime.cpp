// The checkpoint runtime's entry points: a checkpoint call builds a frame and runs the body
// forward, a region call records its decision in forward and is skipped or rerun in recompute.
// Each call is a sequence of named steps below. What forward keeps for recompute is in
// kept_for_recompute.cpp, the frame's own mechanics and recompute in frame.cpp, the saved-tensor
// hooks in checkpoint_hooks.cpp and the engine that hands them out in engine.cpp.

#include "carried_state.hpp"
#include "checkpoint_trace.hpp"
#include "engine.hpp"
#include "frame.hpp"
#include "kept_for_recompute.hpp"
#include "thread_state.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/cpu_offload.hpp>
#include <remat/kept_ops.hpp>
#include <remat/replay.hpp>

#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/functorch/DynamicLayer.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace remat {
namespace detail {
namespace {

using alloc::Phase;
using alloc::Policy;
using alloc::TagScope;

thread_local std::uint64_t t_forwards_started = 0;

// Observes reads for the checkpoint forward while something is still to learn (see
// Frame::observing_needed): the frame removes it as soon as nothing is, so later ops run
// without it, and a save region adds it again when it leaves outputs nothing has read yet.
class ReadObserver {
 public:
  explicit ReadObserver(Frame& frame) : frame_(frame) { frame_.observe_reads_if_needed(); }
  ~ReadObserver() { frame_.stop_observing_reads(); }
  ReadObserver(const ReadObserver&) = delete;
  ReadObserver& operator=(const ReadObserver&) = delete;

 private:
  Frame& frame_;
};

// A save region's body runs without the observer, which ignores ops inside save regions (what
// they read is kept by the save region itself), yet would make every op there box its inputs
// for it: the observer is put back when the body ends, however it ends, where still needed.
// While the thread records input reads (a step profile), it stays: it records theirs.
class NoReadObserverInSaveRegion {
 public:
  explicit NoReadObserverInSaveRegion(Frame& frame) : frame_(frame) {
    if (!recording_input_reads()) frame_.stop_observing_reads();
  }
  ~NoReadObserverInSaveRegion() { frame_.observe_reads_if_needed(); }
  NoReadObserverInSaveRegion(const NoReadObserverInSaveRegion&) = delete;
  NoReadObserverInSaveRegion& operator=(const NoReadObserverInSaveRegion&) = delete;

 private:
  Frame& frame_;
};

// Checkpoints, by name, whose last forward on this thread ran no save region. There every
// read is outside save regions, so every input that is read is needed: such a checkpoint
// keeps all its inputs instead of observing reads, which costs more per call than the
// unused input it could drop. Bounded: a job that names every call differently starts over.
constexpr std::size_t kMaxRemembered = 4096;
thread_local std::unordered_set<std::string> t_without_save_regions;

// Touches the set only when the answer changed, so a steady model looks each name up once.
void remember_save_regions(const std::string& checkpoint, bool remembered, bool ran_save_region) {
  if (remembered == !ran_save_region) return;  // the set already says so
  if (ran_save_region) {
    t_without_save_regions.erase(checkpoint);
    return;
  }
  if (t_without_save_regions.size() >= kMaxRemembered) t_without_save_regions.clear();
  t_without_save_regions.insert(checkpoint);
}

// Names are printed in traces and reports and end C strings: a NUL or another control
// character in one is refused.
void refuse_control_characters(std::string_view what, const std::string& name) {
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto byte = static_cast<unsigned char>(name[i]);
    if (byte >= 0x20 && byte != 0x7F) continue;
    char code[8];
    std::snprintf(code, sizeof code, "\\x%02X", byte);
    throw Error(std::string(what) + " name '" + name.substr(0, std::min<std::size_t>(i, 64)) + "...' holds the control "
                "character " + code + " at byte " + std::to_string(i) + "; name it with printable characters");
  }
}

// The steps of a checkpoint call, in order.

// What makes a checkpoint call impossible here, before anything runs.
void refuse_checkpoint_here(const CheckpointOptions& options) {
  if (options.preserve_rng_state.value_or(false)) {
    throw Error("checkpoint '" + options.region_name +
                "': preserve_rng_state is not supported; pass " + api_name("cpu_rng_state_hook") + "() (or your own " +
                api_name("RecomputeStateHook") + ") in " + option_name("recompute_state_hooks"));
  }
  if (const ThreadState& state = thread_state(); state.mode != Mode::none) {
    throw Error("checkpoint '" + options.region_name + "' is nested inside checkpoint '" +
                state.frame->options.region_name + "'; checkpoints do not nest: use regions inside one checkpoint");
  }
  if (options.region_name.empty()) {
    throw Error(std::string("checkpoint region_name is empty; name the checkpoint, e.g. ") +
                (api_spelling() == ApiSpelling::python ? "checkpoint(region_name=\"layers.0\")"
                                                       : "{.region_name = \"layers.0\"}"));
  }
  refuse_control_characters("checkpoint", options.region_name);
  if (!at::SavedTensorDefaultHooks::is_enabled()) {
    // torch.func transforms, for one, disable saved-tensor hooks: checkpoints rely on them.
    throw Error("checkpoint '" + options.region_name + "' cannot run here: " +
                at::SavedTensorDefaultHooks::get_disabled_error_message().value_or("saved-tensor hooks are disabled"));
  }
}

void refuse_under_vmap(const CheckpointOptions& options) {
  if (const auto layer = at::functorch::maybeCurrentDynamicLayer();
      layer && layer->key() == at::functorch::TransformType::Vmap) {
    // Backward would recompute outside the vmap, on unbatched inputs.
    throw Error("checkpoint '" + options.region_name + "' cannot run under torch.func.vmap: recompute runs the "
                "body again from backward, outside the transform, and would see other inputs; checkpoint inside the "
                "mapped function's caller instead (vmap inside the checkpointed function), or run this under no-grad");
  }
}

// A frame holding what recompute starts from besides the inputs: state hook snapshots, the
// hook pair for inputs, the forward modes, and the call's contexts.
std::shared_ptr<Frame> open_frame(const CheckpointOptions& options, FlatFunction body) {
  auto frame = std::make_shared<Frame>();
  frame->forward_number = ++t_forwards_started;
  frame->options = options;
  // A plan may recompute a region the code saves: its random draws come from the CPU and CUDA
  // generators' states at forward, kept for every caller
  if (options.plan) frame->options.recompute_state_hooks = with_rng_state_hooks(options.recompute_state_hooks);
  frame->plan_offloader = plan_offloader(options.plan);
  frame->body = std::move(body);
  frame->state_at_entry = snapshot_states(frame->options.recompute_state_hooks);
  frame->input_hooks = options.saved_tensor_hooks ? options.saved_tensor_hooks : active_saved_tensor_hooks();
  if (frame->input_hooks && frame->input_hooks->captures_context()) {
    frame->input_hooks_context = frame->input_hooks->capture_context();
  }
  frame->modes = ForwardModes::capture();
  frame->sequence_at_entry = at::sequence_number::peek();
  for (const CheckpointContextFactory& factory : options.contexts) frame->contexts.push_back(factory());
  return frame;
}

// Held during forward; whether recompute needs each one is learned as forward reads them,
// unless `keep_all_inputs`.
void record_inputs(Frame& frame, const TensorList& inputs, bool keep_all_inputs) {
  frame.inputs.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& input = inputs[i];
    if (input.defined() && (input.layout() != at::kStrided || is_nested(input))) {
      throw Error("input " + std::to_string(i) + " of checkpoint '" + frame.options.region_name + "' " +
                  (is_nested(input) ? std::string("is a nested tensor") : "has layout " + c10::str(input.layout())) +
                  "; checkpoints take strided tensors: pass input.to_dense() (or, nested, its unbind()), or keep "
                  "the ops on it outside the checkpoint");
    }
    const bool has_data = storage_of(input) != nullptr;
    InputRecord record{meta_of(input), input, has_data && keep_all_inputs};
    record.given = input.defined() ? input.unsafeGetTensorImpl() : nullptr;
    record.given_grad_fn = input.defined() ? input.grad_fn().get() : nullptr;
    if (input.defined()) {
      record.version = input.unsafeGetTensorImpl()->version_counter();
      if (record.version.enabled()) record.version_at_entry = record.version.current_version();
    }
    frame.inputs.push_back(std::move(record));
    if (has_data && !keep_all_inputs) ++frame.inputs_not_read;
  }
}

// A forward that raises (an out-of-memory error a job catches, Ctrl-C) leaves a graph whose
// hooks own the frame, and the frame holds that graph's tensors: the cycle is cut here, so
// everything the checkpoint kept is freed with the graph.
struct ReleaseIfForwardFails {
  Frame& frame;
  ~ReleaseIfForwardFails() {
    if (!frame.forward_finished) frame.release_after_failed_forward();
  }
};

// The body, with the frame as the thread's checkpoint in forward.
TensorList run_forward(const std::shared_ptr<Frame>& frame, const TensorList& inputs) {
  FrameOwnerScope owner(frame);
  ThreadStateScope scope({frame.get(), Mode::forward, -1, false, nullptr, user_hooks_depth()});
  SavedTensorHooksScope hooks_scope(frame->input_hooks);
  ContextScope context_scope(frame->contexts, /*recompute=*/false);
  ReadObserver observer(*frame);
  auto region_tag = TagScope::region(frame->options.region_name);
  auto phase_tag = TagScope::phase(Phase::forward);
  CallerScope caller(frame->options.caller.get());
  frame->body_starting = true;
  TensorList outputs;
  try {
    outputs = frame->body(inputs);
  } catch (...) {
    frame->body_starting = false;
    throw;
  }
  frame->body_starting = false;
  frame->written_buffers.forward_ended(frame->options.region_name);
  context_scope.close();
  return outputs;
}

void refuse_needed_inputs_changed_in_place(const Frame& frame) {
  for (std::size_t i = 0; i < frame.inputs.size(); ++i) {
    const InputRecord& input = frame.inputs[i];
    if (!input.needed || !input.changed_in_place()) continue;
    throw Error("checkpoint '" + frame.options.region_name + "' changed its input " + std::to_string(i) +
                " in place (an operation such as x.mul_() or x += y on it); recompute would start from the changed "
                "value and give wrong gradients: make that operation out-of-place, or clone the input inside the "
                "body first");
  }
}

// Readies the frame for backward (the dropped tensors' slots, the early stop, the parameters
// recompute reads again) and records it for the reports.
void finish_forward(Frame& frame, const TensorList& outputs) {
  frame.stop_early = at::sequence_number::peek() != frame.sequence_at_last_drop;
  for (DroppedVersion& saved : frame.dropped_versions) saved.version_at_forward_end = saved.version.current_version();
  frame.note_forward_reads(outputs);
  frame.recreated.assign(frame.dropped + frame.ferried.size(), at::Tensor());
  frame.filled.assign(frame.dropped + frame.ferried.size(), false);
  frame.forward_finished = true;
  frame.make_live();
  record_scope({frame.options.region_name, frame.regions, frame.forward_number});
}

// The steps of a region call, in forward and in recompute.

void refuse_region_name(const std::string& name) {
  if (name.empty()) throw Error("region name is empty; name each region, e.g. \"attention\"");
  refuse_control_characters("region", name);
}

// Whether the region recomputes: as the caller asked, unless the checkpoint's plan chose.
bool planned_recompute(const Frame& frame, const std::string& name, bool recompute) {
  if (frame.options.plan) {
    if (const auto choice = frame.options.plan->choice_for(frame.region_path(name))) {
      return *choice == budget::Choice::recompute;
    }
  }
  return recompute;
}

// Inside a save region everything is kept and recompute skips the whole body: an inner save
// region has nothing to add (it runs inert, claiming no name), an inner recompute region could
// never be recomputed. Under a plan, which may save an outer region whose inner ones recompute,
// they run as part of it.
void refuse_recompute_inside_save_region(const Frame& frame, const ThreadState& state, const std::string& name,
                                         bool recompute) {
  if (!recompute || frame.options.plan) return;
  throw Error("region '" + name + "' (recompute=True) is nested inside a recompute=False (save) region, '" +
              frame.region_path(*state.region) + "'; recompute skips the save region's whole body, so "
              "the inner region cannot be recomputed: make the inner region recompute=False, or the enclosing "
              "one recompute=True");
}

// Recompute must reach the regions forward ran, in order, with the same settings.
void refuse_another_path_in_recompute(const Frame& frame, std::size_t index, const std::string& name, bool recompute) {
  if (index >= frame.regions.size() || frame.regions[index].name != name) {
    throw Error("recompute of checkpoint '" + frame.options.region_name + "' reached region '" + name +
                "' where forward ran " +
                (index < frame.regions.size() ? "'" + frame.regions[index].name + "'" : std::string("no region")) +
                "; the body must take the same path in recompute as in forward");
  }
  if (frame.regions[index].saved == recompute) {
    throw Error("region '" + frame.region_path(name) + "' ran with recompute=" +
                (recompute ? "False" : "True") + " in forward but recompute=" + (recompute ? "True" : "False") +
                " in recompute; a region's recompute setting must not depend on " + api_name("is_recomputing") +
                "() or on state that changes between forward and backward");
  }
}

// Makes region `index` the frame's running one for a scope (nested regions put the outer one back).
class RunningRegionScope {
 public:
  RunningRegionScope(Frame& frame, std::size_t index)
      : frame_(frame), previous_(std::exchange(frame.running_region, static_cast<std::int64_t>(index))) {}
  ~RunningRegionScope() { frame_.running_region = previous_; }
  RunningRegionScope(const RunningRegionScope&) = delete;
  RunningRegionScope& operator=(const RunningRegionScope&) = delete;

 private:
  Frame& frame_;
  std::int64_t previous_;
};

// In recompute: a save region is skipped (or, where it must, run again: rerun_reason), a
// recompute region's body runs again. A save region run again draws the random numbers forward
// drew (the states before it are forward's); what it saves is dropped (forward kept its own),
// and the tensors it saved from inputs recompute recreates are taken from them after it ran, as
// forward's were changed by then.
TensorList run_region_in_recompute(Frame& frame, const ThreadState& state, const FlatFunction& body,
                                   const std::string& name, bool recompute, const TensorList& inputs,
                                   std::shared_ptr<void>* annotation) {
  const std::size_t index = frame.recompute_regions++;
  refuse_another_path_in_recompute(frame, index, name, recompute);
  int save_index = -1;
  if (frame.regions[index].saved) {
    save_index = 0;
    for (std::size_t i = 0; i < index; ++i) save_index += frame.regions[i].saved ? 1 : 0;
    if (frame.save_regions[static_cast<std::size_t>(save_index)].rerun_reason.empty()) {
      return outputs_of_skipped_save_region(frame, save_index, name, inputs, annotation);
    }
  }
  ThreadState inner = state;
  inner.in_region = true;
  inner.region = &name;
  inner.save_region = save_index;
  TensorList outputs;
  {
    ThreadStateScope scope(inner);
    RunningRegionScope running(frame, index);
    auto region_tag = TagScope::region(name, save_index >= 0 ? Policy::save : Policy::recompute);
    const auto kept = frame.kept_ops.find(index);
    if (kept == frame.kept_ops.end()) {
      outputs = body(inputs);
    } else {
      KeptOps::Scope taking(*kept->second, /*recomputing=*/true);
      outputs = body(inputs);
      taking.finish();
    }
  }
  if (save_index >= 0) frame.fill_ferried(save_index, inputs);
  return outputs;
}

void refuse_duplicate_region(const Frame& frame, const std::string& name) {
  for (const RegionDecision& seen : frame.regions) {
    if (seen.name == name) {
      // The second sentence is torch_remat's, which code written against it matches.
      throw Error("region '" + name + "' appears twice in checkpoint '" + frame.options.region_name +
                  "'; region names must be unique within a checkpoint (Duplicate torch_remat region name " +
                  frame.region_path(name) + " during forward)");
    }
  }
}

void refuse_leaf_outputs(const Frame& frame, const std::string& name, const TensorList& outputs) {
  for (const at::Tensor& out : outputs) {
    if (!out.defined() || !out.requires_grad() || !out.is_leaf()) continue;
    throw Error("region '" + frame.region_path(name) + "' returned a leaf tensor that requires grad (no "
                "grad_fn: a bare allocation such as torch.zeros(..., requires_grad=True), or an input returned as "
                "it is); recompute cannot recreate it as the same tensor: move the allocation outside the checkpoint, "
                "or do not wrap it in a region");
  }
}

// Recompute takes a recorded decision back instead of running the ops that made it, so the ops
// forward ran cannot be matched there.
[[noreturn]] void refuse_kept_ops_with_replay(KeptOps& ops) {
  ops.clear();
  C10_THROW_ERROR(ValueError,
                  "region '" + ops.region() +
                      "' records a decision on a RecomputeReplay channel, which "
                      "recompute takes back instead of running its ops again, so the ops forward ran cannot "
                      "be matched in recompute: a per-op plan keeps no op of such a region; profile the "
                      "model again and plan from that profile (a profile lists no ops of such a region)");
}

// In forward: the region's decision is recorded, its inputs noted, its body run, and a save
// region's outputs recorded.
TensorList run_region_in_forward(Frame& frame, const ThreadState& state, const FlatFunction& body,
                                 const std::string& name, bool recompute, const TensorList& inputs,
                                 std::shared_ptr<void>* annotation) {
  refuse_duplicate_region(frame, name);
  const std::size_t index = frame.regions.size();
  frame.regions.push_back({name, !recompute});
  // Inputs a region consumes: a save region's output is persisted, and a checkpoint input
  // read by a recompute region is kept.
  for (const at::Tensor& input : inputs) {
    frame.persist(input);
    if (recompute) frame.note_read(input);
  }

  ThreadState inner = state;
  inner.in_region = true;
  inner.region = &name;
  if (!recompute) inner.save_region = static_cast<int>(frame.save_regions.size());
  std::vector<std::optional<std::uint32_t>> input_versions;
  std::vector<bool> made_here;
  if (!recompute) {
    for (const at::Tensor& input : inputs) {
      input_versions.push_back(version_of(input));
      made_here.push_back(made_in_checkpoint(frame, input));
    }
    frame.note_recreated_region_inputs(inputs);
  }
  TensorList outputs;
  const std::uint64_t first_node = at::sequence_number::peek();
  {
    std::optional<NoReadObserverInSaveRegion> unobserved;
    if (!recompute) unobserved.emplace(frame);
    ThreadStateScope scope(inner);
    RunningRegionScope running(frame, index);
    auto region_tag = TagScope::region(name, recompute ? Policy::recompute : Policy::save);
    // Ops are kept for a backward that may follow: not where the region runs without gradients.
    const bool may_keep = recompute && frame.options.plan && at::GradMode::is_enabled();
    const std::string path = may_keep ? frame.region_path(name) : std::string();
    const auto* kept = may_keep ? frame.options.plan->kept_ops_for(path) : nullptr;
    if (kept == nullptr) {
      outputs = body(inputs);
    } else {
      auto& ops = frame.kept_ops[index] = std::make_unique<KeptOps>(path, *kept);
      const std::uint64_t decisions = recorded_decisions();
      KeptOps::Scope holding(*ops, /*recomputing=*/false);
      outputs = body(inputs);
      holding.finish();
      if (recorded_decisions() != decisions) refuse_kept_ops_with_replay(*ops);
    }
  }
  const std::uint64_t end_node = at::sequence_number::peek();
  frame.recreated_region_inputs.clear();
  frame.pending_names.clear();
  refuse_leaf_outputs(frame, name, outputs);
  if (!recompute) {
    std::string rerun_reason = rerun_for_changed_inputs(frame, name, inputs, input_versions, made_here);
    record_save_region(frame, name, inputs, outputs, first_node, end_node, annotation, std::move(rerun_reason));
  }
  return outputs;
}

}  // namespace

TensorList run_checkpoint(const CheckpointOptions& options, FlatFunction body, TensorList inputs) {
  refuse_checkpoint_here(options);
  if (!at::GradMode::is_enabled()) {
    // Nothing will run backward: run once and register nothing.
    auto region_tag = TagScope::region(options.region_name);
    CallerScope caller(options.caller.get());
    return body(inputs);
  }
  refuse_under_vmap(options);
  ensure_engine_installed();

  const std::shared_ptr<Frame> frame = open_frame(options, std::move(body));
  // Under a plan (or a profile, which passes an empty one) whether a call runs save regions is the
  // plan's choice, which may differ from the last call's: the remembered answer would keep inputs
  // that the plan's saved regions let the runtime drop, so planned calls neither read nor write it.
  const bool keep_all_inputs = !options.plan && t_without_save_regions.contains(options.region_name);
  record_inputs(*frame, inputs, keep_all_inputs);
  ReleaseIfForwardFails release_if_failed{*frame};
  TensorList outputs = run_forward(frame, inputs);
  keep_ferried_where_nothing_else_is_recomputed(*frame);
  settle_persisted_outputs(*frame);
  settle_needed_inputs(*frame);
  refuse_needed_inputs_changed_in_place(*frame);
  keep_needed_inputs(*frame);
  keep_persisted_outputs(*frame);
  if (!options.plan) remember_save_regions(options.region_name, keep_all_inputs, !frame->save_regions.empty());
  finish_forward(*frame, outputs);
  return outputs;
}

TensorList run_region(FlatFunction body, const std::string& name, bool recompute, TensorList inputs,
                      std::shared_ptr<void>* annotation) {
  const ThreadState& state = thread_state();
  if (state.mode == Mode::none) {
    return body(inputs);  // outside a checkpoint a region is just its body
  }
  Frame& frame = *state.frame;
  refuse_region_name(name);
  recompute = planned_recompute(frame, name, recompute);
  // A region the plan offloads runs saved with the plan's offloader in force: what it saves, and
  // its outputs recompute reads (packed as forward ends, through the pair recorded here), go to
  // the host.
  std::optional<SavedTensorHooksScope> offloading;
  if (state.mode == Mode::forward && !recompute && frame.plan_offloader &&
      frame.options.plan->offloads(frame.region_path(name))) {
    offloading.emplace(frame.plan_offloader);
  }
  if (state.in_region && state.save_region >= 0) {
    refuse_recompute_inside_save_region(frame, state, name, recompute);
    return body(inputs);
  }
  if (state.mode == Mode::recompute) {
    return run_region_in_recompute(frame, state, body, name, recompute, inputs, annotation);
  }
  return run_region_in_forward(frame, state, body, name, recompute, inputs, annotation);
}

}  // namespace detail

void recompute_needs_tensor(const at::Tensor& t) {
  const detail::ThreadState& state = detail::thread_state();
  if (state.mode != detail::Mode::forward || state.frame == nullptr) return;
  state.frame->persist(t);
}

namespace detail {

std::shared_ptr<const void> running_checkpoint() { return frame_owner(); }

std::int64_t running_region(const void* checkpoint) { return static_cast<const Frame*>(checkpoint)->running_region; }

namespace {
thread_local std::uint64_t t_recorded_decisions = 0;
}  // namespace

void count_recorded_decision() { ++t_recorded_decisions; }

std::uint64_t recorded_decisions() { return t_recorded_decisions; }

}  // namespace detail

bool is_recomputing() { return detail::thread_state().mode == detail::Mode::recompute; }

bool in_checkpoint() { return detail::thread_state().mode != detail::Mode::none; }

void note_tensors_held_by_the_body(const std::function<TensorList()>& tensors) {
  const detail::ThreadState& state = detail::thread_state();
  if (state.mode != detail::Mode::recompute || state.frame == nullptr || !state.frame->body_starting) return;
  state.frame->body_starting = false;
  state.frame->held_as_recompute_began = tensors();
}

void note_buffers_held_by_the_body(const std::function<std::vector<HeldBuffer>()>& buffers) {
  const detail::ThreadState& state = detail::thread_state();
  if (state.mode != detail::Mode::forward || state.frame == nullptr || !state.frame->body_starting) return;
  state.frame->body_starting = false;
  state.frame->written_buffers.forward_began(state.frame->options.region_name, buffers());
}

bool given_back_to_recompute(const at::Tensor& t) {
  const detail::ThreadState& state = detail::thread_state();
  return state.mode == detail::Mode::forward && state.frame != nullptr && state.frame->written_buffers.watches(t);
}

std::optional<ForwardPosition> forward_position() {
  const detail::ThreadState& state = detail::thread_state();
  if (state.mode != detail::Mode::forward || state.frame == nullptr) return std::nullopt;
  return ForwardPosition{state.frame->forward_number, state.frame->regions.size()};
}

}  // namespace remat
