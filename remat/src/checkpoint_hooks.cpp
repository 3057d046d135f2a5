// The saved-variable hooks of a checkpoint (checkpoint_hooks.hpp). Pack, in forward: a save
// region's tensor is kept (as it is, or packed through the hook pair in force, or, when it views
// an input recompute recreates, taken from that input again unless the checkpoint's forward ends
// with nothing else to recompute); any other is dropped, with what
// recompute's must match. Pack, in recompute: the recreated tensor fills the dropped one's slot,
// and recompute stops once every slot is filled. Unpack: the kept or packed tensor, or the
// recreated one, recomputing first when it is missing.

#include "checkpoint_hooks.hpp"

#include "frame.hpp"
#include "saved_registry.hpp"
#include "thread_state.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/saved_tensors_walk.hpp>

#include <ATen/SequenceNumber.h>
#include <ATen/ops/equal.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

namespace remat::detail {
namespace {

std::atomic<BackwardErrorTranslator> g_backward_error_translator{nullptr};
std::atomic<RecomputeStopRaiser> g_recompute_stop_raiser{nullptr};

// What recompute's early stop is, as the body sees it.
std::string stop_name() {
  return api_spelling() == ApiSpelling::python ? "remat.RecomputeStopped, a BaseException"
                                               : "remat::detail::StopRecompute";
}

// A cast of a leaf that requires grad, or a view of one (KeptTensor::leaf_cast): its grad_fn is
// the copy's, whose one input is the leaf's gradient accumulator.
bool leaf_cast(const at::Tensor& tensor) {
  const auto cast_of_leaf = [](const at::TensorBase& t) {
    const std::shared_ptr<torch::autograd::Node>& node = t.grad_fn();
    if (node == nullptr || node->name() != "ToCopyBackward0" || node->num_outputs() != 1) return false;
    return dynamic_cast<const torch::autograd::AccumulateGrad*>(node->next_edge(0).function.get()) != nullptr;
  };
  return cast_of_leaf(tensor) || (tensor.is_view() && cast_of_leaf(tensor._base()));
}

const at::TensorBase& base_of(const at::Tensor& tensor) {
  return tensor.is_view() ? tensor._base() : static_cast<const at::TensorBase&>(tensor);
}

bool of_parameter(const at::Tensor& tensor) { return base_of(tensor).is_leaf() && base_of(tensor).requires_grad(); }

// Whether `tensor` takes a gradient and was computed before `sequence` (its graph node, or its
// base's, numbered below it): not a cast autocast caches.
bool computed_before(const at::Tensor& tensor, std::uint64_t sequence) {
  if (!tensor.requires_grad() || !tensor.has_storage() || leaf_cast(tensor)) return false;
  const std::shared_ptr<torch::autograd::Node>& node = base_of(tensor).grad_fn();
  return node != nullptr && node->sequence_nr() < sequence;
}

// DroppedMeta::read of a tensor forward dropped. The checkpoint's inputs that take a gradient are
// other: recompute is given them as leaves of their own. One that takes none is frozen without
// looking through the inputs: what recompute is given in its place (over forward's memory, or a
// placeholder the body never held) is let be by frozen_swapped.
DroppedMeta::Read read_in_forward(const Frame& frame, const at::Tensor& tensor) {
  if (!tensor.has_storage()) return DroppedMeta::Read::other;
  if (!tensor.requires_grad()) return DroppedMeta::Read::frozen;
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (std::any_of(frame.inputs.begin(), frame.inputs.end(), [&](const InputRecord& input) {
        return input.value.defined() && input.value.has_storage() &&
               input.value.storage().unsafeGetStorageImpl() == storage;
      })) {
    return DroppedMeta::Read::other;
  }
  if (of_parameter(tensor)) return DroppedMeta::Read::parameter;
  return computed_before(tensor, frame.sequence_at_entry) ? DroppedMeta::Read::computed_before
                                                          : DroppedMeta::Read::other;
}

// Whether recompute read `recreated` from a tensor that takes no gradient the body held as
// recompute began (a module's frozen weight or buffer) other than forward's `frozen`, of one shape
// and type, with other values where it reads them: a frozen weight swapped in for forward or
// backward alone. A tensor forward read that is gone cannot be compared, and is let be.
bool frozen_swapped(const Frame& frame, const c10::intrusive_ptr<c10::TensorImpl>& frozen,
                    const at::Tensor& recreated) {
  const at::Tensor then(frozen);
  const at::TensorBase& now = base_of(recreated);
  if (recreated.requires_grad() || !then.has_storage() || !now.has_storage() ||
      then.storage().is_alias_of(now.storage()) || !then.sizes().equals(now.sizes()) ||
      !then.strides().equals(now.strides()) || then.storage_offset() != now.storage_offset() ||
      then.storage().nbytes() != now.storage().nbytes() || then.scalar_type() != now.scalar_type() ||
      then.device() != now.device() || !held_by_the_body(now.unsafeGetTensorImpl(), frame.held_as_recompute_began)) {
    return false;
  }
  // The part of forward's tensor that forward saved, as recompute saved it of its own.
  const at::Tensor saved_then = then.as_strided(recreated.sizes(), recreated.strides(), recreated.storage_offset());
  return !at::equal(saved_then, recreated);
}

// Weights swapped in for forward or backward alone: recompute reads a parameter where forward read
// a tensor computed before the checkpoint; or where forward read a parameter, a tensor computed
// before recompute, or another parameter over other memory made outside the body (swapped_leaf);
// or another frozen tensor (frozen_swapped).
std::optional<std::string> swapped_read(const Frame& frame, std::size_t index, const at::Tensor& recreated,
                                        int region) {
  const DroppedMeta& forward = frame.dropped_metas[index];
  std::string read, was;
  if (forward.read == DroppedMeta::Read::computed_before && of_parameter(recreated)) {
    read = "a parameter";
    was = "a tensor computed before the checkpoint";
  } else if (forward.read == DroppedMeta::Read::parameter && computed_before(recreated, frame.sequence_at_recompute)) {
    read = "a tensor computed before recompute began";
    was = "a parameter";
  } else if (const auto parameter = forward.parameter.lock();
             forward.read == DroppedMeta::Read::parameter && of_parameter(recreated) && parameter &&
             parameter.get() != base_of(recreated).unsafeGetTensorImpl() &&
             !at::Tensor(parameter).storage().is_alias_of(base_of(recreated).storage()) &&
             swapped_leaf(at::TensorBase(parameter), false, base_of(recreated), frame.held_as_recompute_began)) {
    read = "another parameter";
    was = "a parameter";
  } else if (const auto frozen = forward.parameter.lock();
             forward.read == DroppedMeta::Read::frozen && frozen && frozen_swapped(frame, frozen, recreated)) {
    read = "a frozen weight or buffer (a tensor that takes no gradient)";
    was = "another, with other values";
  } else {
    return std::nullopt;
  }
  return swapped_weights_error(frame.options.region_name, read + " as saved tensor #" + std::to_string(index) + " (" +
                                                              forward.describe() + ") in " + frame.where(region) +
                                                              ", where forward read " + was);
}

// What is wrong with the tensor recompute recreated in place of dropped tensor `index`, if
// anything: another shape, dtype or device, or weights swapped in (swapped_read) always; other
// values under verify_recompute.
std::optional<std::string> recreated_mismatch(const Frame& frame, std::size_t index, const at::Tensor& recreated,
                                              int region) {
  const DroppedMeta& forward_meta = frame.dropped_metas[index];
  if (!forward_meta.describes(recreated)) {
    const DroppedMeta now_meta = DroppedMeta::of(recreated, region);
    return "recompute of checkpoint '" + frame.options.region_name + "' recreated saved tensor #" +
           std::to_string(index) + " as " + now_meta.describe() + " in " + frame.where(region) +
           ", but forward saved " + forward_meta.describe() + " in " + frame.where(forward_meta.region) + "; " +
           same_path_advice();
  }
  if (auto swapped = swapped_read(frame, index, recreated, region)) return swapped;
  if (!frame.options.verify_recompute) return std::nullopt;
  const Fingerprint& forward = frame.fingerprints[index];
  const Fingerprint now = fingerprint_of(recreated, forward.where);
  if (now.hash == forward.hash) return std::nullopt;
  std::string shape;
  for (const std::int64_t d : forward.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  char figures[256];
  std::snprintf(figures, sizeof figures, "sum %.9g in forward vs %.9g in recompute (difference %.3g), L2 norm %.9g vs %.9g",
                forward.sum, now.sum, now.sum - forward.sum, forward.norm, now.norm);
  return "verify_recompute: checkpoint '" + frame.options.region_name + "': saved tensor #" + std::to_string(index) +
         " of " + forward.where + " (shape [" + shape + "]) differs between forward and recompute: " + figures +
         ". The region is not deterministic, or what it reads changed between forward and backward: add a " +
         api_name("RecomputeStateHook") + " for the state it depends on (RNG: " + api_name("cpu_rng_state_hook") +
         "()); parameters swapped in for the forward alone (torch.func.functional_call around the checkpoint) must "
         "stay in place until its backward";
}

// Hooks attached to every tensor autograd saves while a checkpoint runs on this thread.
class SavedHooks final : public torch::autograd::SavedVariableHooks {
 public:
  SavedHooks(std::shared_ptr<Frame> frame, ThreadState state)
      : frame_(std::move(frame)), state_(state), tracked_(saved_tracking_enabled() && state.mode == Mode::forward) {}
  ~SavedHooks() override {
    if (tracked_) unregister_saved(this);
  }
  SavedHooks(const SavedHooks&) = delete;
  SavedHooks& operator=(const SavedHooks&) = delete;

  // The pack path: in recompute, the tensor fills the slot of the one forward dropped; in
  // forward, a save region keeps it (or its pair packs it, or recompute will take it from the
  // region's input), and code outside save regions drops it for recompute.
  void call_pack_hook(const at::Tensor& tensor) override {
    if (state_.mode == Mode::recompute) {
      // A save region run again saves again what forward kept: nothing to fill.
      if (state_.save_region >= 0) {
        frame_.reset();
        return;
      }
      fill_recreated_slot(tensor);
      return;
    }
    frame_->persist(tensor);  // a save region's output that autograd saves must survive
    if (state_.save_region >= 0) {
      keep_for_save_region(tensor);
      return;
    }
    drop_for_recompute(tensor);
  }

  at::Tensor call_unpack_hook() override {
    if (state_.mode == Mode::recompute) {
      // Recompute's own graph holds no data: what it saves fills forward's slots, or, in a save
      // region run again, forward kept already. It is reached only through tensors recompute made
      // that outlived it (held by an error's traceback, say, where a report walks them).
      const Error error(
          "a tensor autograd saved while a checkpoint recomputed was unpacked: recompute's own graph keeps no saved "
          "tensors, so backward cannot run through tensors recompute made (they outlive it only where something holds "
          "them, such as an error's traceback)");
      if (const auto translate = g_backward_error_translator.load()) translate(error);
      throw error;
    }
    const bool kept = kept_.defined() || packed_ || kept_in_place_of_recompute();
    if (SavedTensorsWalk* walk = entered_walk(); walk != nullptr && frame_) {
      walk->note_checkpoint(frame_);
      if (!kept) {
        throw Error(std::string(SavedTensorsWalk::kDroppedForRecompute) + " by checkpoint '" +
                    frame_->options.region_name + "'");
      }
    }
    try {
      // Disabled (never checked) for tensors dropped outside save regions: recompute makes them.
      if (version_.enabled() && version_.current_version() != saved_version_) throw modified_in_place();
      if (kept_.defined()) return kept_;
      if (kept_in_place_of_recompute()) return *kept_instead_;
      if (packed_) {
        frame_->recompute_before_unpacks();
        return packed_.unpack();
      }
      return frame_->take_recreated(ferried_ ? frame_->dropped + index_ : index_);
    } catch (const Error& e) {
      if (const auto translate = g_backward_error_translator.load()) translate(e);
      throw;
    }
  }

 private:
  bool kept_in_place_of_recompute() const { return kept_instead_ && kept_instead_->defined(); }

  void fill_recreated_slot(const at::Tensor& tensor) {
    Frame& f = *frame_;
    const std::size_t index = f.recompute_packs++;
    const int region = state_.in_region ? static_cast<int>(f.recompute_regions) - 1 : -1;
    if (index >= f.dropped && f.stop_raised) {
      stop_with_mismatch("the body of checkpoint '" + f.options.region_name + "' caught recompute's early stop (" +
                         stop_name() + ", raised once every tensor backward needs exists) and went on to save " +
                         DroppedMeta::of(tensor, region).describe() + " in " + f.where(region) +
                         "; let it propagate: where the body catches every exception, re-raise " + stop_name());
    }
    if (index >= f.dropped) {
      stop_with_mismatch("recompute of checkpoint '" + f.options.region_name + "' saved more tensors than forward (" +
                         std::to_string(f.dropped) + "): the next is " + DroppedMeta::of(tensor, region).describe() +
                         " in " + f.where(region) + "; the body must take the same path in recompute as in forward");
    }
    if (!f.filled[index]) {
      if (auto mismatch = recreated_mismatch(f, index, tensor, region)) stop_with_mismatch(std::move(*mismatch));
      // Held with its recompute graph, which saves nothing (these hooks keep no data), until
      // backward unpacks it; autograd rewraps what unpack returns, so no detach is needed.
      f.recreated[index] = tensor;
      f.filled[index] = true;
      if (--f.missing == 0 && f.stop_early) stop_recompute(f);
    }
    frame_.reset();  // the recompute graph is thrown away; nothing to keep
  }

  // Kept: as it is, or through the hook pair in force. The hook still holds the frame: what the
  // checkpoint persisted stays resident as long as the graph that may need it.
  void keep_for_save_region(const at::Tensor& tensor) {
    Frame& f = *frame_;
    for (const auto& [impl, given] : f.pending_names) {
      if (impl == tensor.unsafeGetTensorImpl()) saved_name_ = given;
    }
    // Autograd does not check the version of a tensor saved through hooks: these do, as
    // autograd would, so an in-place change after the save is an error, not a wrong gradient.
    region_index_ = static_cast<int>(f.regions.size()) - 1;
    version_ = tensor.unsafeGetTensorImpl()->version_counter();
    if (version_.enabled()) saved_version_ = version_.current_version();
    const std::shared_ptr<SavedTensorHooks>& hooks = active_saved_tensor_hooks();
    if (const std::optional<std::size_t> slot = f.ferry(tensor, state_.save_region, !hooks, saved_name_)) {
      // Recompute recreates the region's input it views: taken from there, unless forward's end
      // keeps it (FerriedTensor::held).
      ferried_ = true;
      index_ = *slot;
      kept_instead_ = f.ferried[*slot].held;
      f.sequence_at_last_drop = at::sequence_number::peek();
      track(at::Tensor());
      return;
    }
    const bool parameter = of_parameter(tensor);
    if (hooks) {
      const std::any context = hooks->captures_context() ? hooks->capture_context() : std::any();
      packed_ = PackedTensor(hooks, tensor.detach(), {SavedTensorKind::backward, &context, parameter, &f});
      track(at::Tensor());
      return;
    }
    // variable_data(): the same storage without the graph, as detach() gives, but without a
    // dispatcher round trip; the runtime uses it wherever it holds tensors past forward.
    kept_ = tensor.variable_data();
    if (!parameter && kept_.has_storage()) alloc::categorize_as_activation(kept_.storage().data());  // not sparse
    f.kept.push_back({state_.save_region, saved_name_, parameter, leaf_cast(tensor),
                      c10::weak_intrusive_ptr<c10::TensorImpl>(kept_.getIntrusivePtr())});
    track(kept_);
  }

  // Outside save regions: recompute recreates it, so forward keeps only what recompute checks
  // its own against.
  void drop_for_recompute(const at::Tensor& tensor) {
    Frame& f = *frame_;
    if (is_nested(tensor)) {
      throw Error(std::string("a nested tensor is saved for backward in ") +
                  (state_.region != nullptr ? "region '" + f.region_path(*state_.region) + "'"
                                            : "the body of checkpoint '" + f.options.region_name + "'") +
                  ", which recompute would make again: the runtime recomputes strided tensors only; make it a save "
                  "region (recompute=False), or keep the nested ops outside the checkpoint");
    }
    f.note_read(tensor);
    DroppedMeta& meta = f.dropped_metas.emplace_back(
        DroppedMeta::of(tensor, state_.in_region ? static_cast<int>(f.regions.size()) - 1 : -1));
    meta.read = read_in_forward(f, tensor);
    meta.producer = SavedProducer::of(tensor);
    if (meta.read == DroppedMeta::Read::parameter || meta.read == DroppedMeta::Read::frozen) {
      meta.parameter = c10::weak_intrusive_ptr<c10::TensorImpl>(base_of(tensor).getIntrusivePtr());
    }
    if (f.options.verify_recompute) {
      f.fingerprints.push_back(fingerprint_of(
          tensor, state_.region != nullptr ? "region '" + f.region_path(*state_.region) + "'"
                                           : std::string("the body of checkpoint '") + f.options.region_name + "'"));
    }
    // Recompute reads again what the body read from outside (a weight or a mask in its closure),
    // and autograd, which would refuse a saved tensor changed after the save, no longer sees it:
    // its version is kept to check before recompute. Every dropped tensor's is, since whether one
    // without a graph node was made inside the body is not known; one made inside and changed
    // after the save is refused by autograd too, on unpack.
    if (tensor.unsafeGetTensorImpl()->version_counter().enabled()) {
      const c10::VariableVersion& version = tensor.unsafeGetTensorImpl()->version_counter();
      f.dropped_versions.push_back({f.dropped, version, version.current_version()});
    }
    index_ = f.dropped++;
    f.sequence_at_last_drop = at::sequence_number::peek();
    track(at::Tensor());
  }

  Error modified_in_place() const {
    std::string message = "saved tensor ";
    if (!saved_name_.empty()) message += "'" + saved_name_ + "' ";
    message += "of " + frame_->where(region_index_) + " was modified in-place after it was saved (version " +
               std::to_string(saved_version_) + ", now " + std::to_string(version_.current_version()) +
               "); backward would use the changed value and give a wrong gradient: make the in-place operation "
               "out-of-place, or clone the tensor before changing it";
    return Error(message);
  }

  // Ends recompute: the body is stopped as by an early stop, and recompute raises `mismatch`.
  [[noreturn]] void stop_with_mismatch(std::string mismatch) {
    frame_->recompute_mismatch = std::move(mismatch);
    frame_.reset();
    throw_recompute_stop();
  }

  void track(const at::Tensor& resident) {
    if (!tracked_) return;
    SavedEntry entry = entry_for_current_node();
    entry.tensor = resident;
    entry.checkpoint = frame_->options.region_name;
    entry.frame = frame_;
    register_saved(this, std::move(entry));
  }

  std::shared_ptr<Frame> frame_;
  ThreadState state_;
  bool tracked_;
  at::Tensor kept_;
  PackedTensor packed_;  // in place of kept_ when a hook pair was in force
  c10::VariableVersion version_{c10::VariableVersion::DISABLED};
  std::uint32_t saved_version_ = 0;
  std::string saved_name_;  // given with name_saved_tensors(), for reports and errors
  int region_index_ = -1;
  std::size_t index_ = 0;  // the dropped tensor's slot, or the ferried tensor's when ferried_
  bool ferried_ = false;
  // A ferried tensor as saved, shared with the frame's slot: still defined once forward ends where
  // the frame kept it instead of recomputing it.
  std::shared_ptr<at::Tensor> kept_instead_;
};

}  // namespace

std::unique_ptr<torch::autograd::SavedVariableHooks> make_checkpoint_hooks(std::shared_ptr<Frame> frame,
                                                                           const ThreadState& state) {
  return std::make_unique<SavedHooks>(std::move(frame), state);
}

void set_backward_error_translator(BackwardErrorTranslator translator) { g_backward_error_translator = translator; }

void set_recompute_stop_raiser(RecomputeStopRaiser raiser) { g_recompute_stop_raiser = raiser; }

void throw_recompute_stop() {
  if (const auto raise = g_recompute_stop_raiser.load()) raise();
  throw StopRecompute{};
}

void stop_recompute(Frame& frame) {
  frame.stop_raised = true;
  throw_recompute_stop();
}

}  // namespace remat::detail
