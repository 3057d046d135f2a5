// The frame of one checkpoint call: what it keeps (inputs and save-region outputs, matched by
// storage), what it learns of the reads recompute repeats, and recompute itself, run from
// backward on the first unpack of a dropped tensor. The calls that build a frame in forward are
// in runtime.cpp.

#include "frame.hpp"

#include "carried_state.hpp"
#include "generator_states.hpp"
#include "live_frames.hpp"
#include "thread_state.hpp"

#include <remat/alloc/tags.hpp>
#include <remat/input_reads.hpp>

#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_conj.h>
#include <ATen/ops/_neg_view.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

namespace remat::detail {
namespace {

thread_local bool t_recording_input_reads = false;
thread_local std::vector<std::uintptr_t> t_input_reads;  // storages of the inputs read, each once
thread_local std::size_t t_ops_watched_in_save_regions = 0;
thread_local std::vector<std::string> t_collectives;  // collective ops run while recording

// A collective: another rank runs its counterpart, so running it again in recompute on one rank
// alone pairs it with whatever that rank's peers run next.
bool is_collective(std::string_view op) {
  return op.starts_with("c10d::") || op.starts_with("_c10d_functional::") ||
         op.starts_with("_c10d_functional_autograd::");
}

// Sees the ops the checkpoint body runs outside save regions (recompute runs them again), to
// learn which inputs they read and which save-region outputs they need; and, while the thread
// records input reads, those inside save regions, for the record alone.
std::unique_ptr<at::ObserverContext> observe_op(const at::RecordFunction& fn) {
  const ThreadState& state = thread_state();
  if (state.mode != Mode::forward || state.frame == nullptr) return nullptr;
  const bool in_save_region = state.save_region >= 0;
  if (in_save_region && !t_recording_input_reads) return nullptr;
  if (t_recording_input_reads && is_collective(fn.name())) t_collectives.emplace_back(fn.name());
  if (in_save_region) ++t_ops_watched_in_save_regions;
  const auto note = [&](const at::Tensor& t) {
    in_save_region ? state.frame->note_read_in_save_region(t) : state.frame->note_read(t);
  };
  for (const c10::IValue& value : fn.inputs()) {
    if (value.isTensor()) {
      note(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) note(t);
    }
  }
  return nullptr;
}

// Once per checkpoint name: a recompute drew random numbers where the checkpoint keeps no RNG state.
void warn_of_random_draws(const std::string& region_name) {
  static std::mutex mutex;
  static std::unordered_set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(region_name).second) return;
  }
  TORCH_WARN("checkpoint '", region_name,
             "' drew random numbers in recompute (dropout, or another random op outside its save regions) and keeps "
             "no RNG state: recompute drew other numbers than forward did, so its gradients are not those without "
             "checkpointing. Keep the generators' states with ",
             option_name("recompute_state_hooks"), " holding ", api_name("cpu_rng_state_hook"), "() and ",
             api_name("cuda_rng_state_hook"), "() (where it draws on CUDA), or run the random op in a save region");
}

// Notes `storage` where it is one of `frame`'s inputs' (recording input reads).
void record_input_read(const Frame& frame, const c10::StorageImpl* storage) {
  const auto address = reinterpret_cast<std::uintptr_t>(storage->data());
  if (std::find(t_input_reads.begin(), t_input_reads.end(), address) != t_input_reads.end()) return;
  for (const InputRecord& input : frame.inputs) {
    if (storage_of(input.value) == storage) {
      t_input_reads.push_back(address);
      return;
    }
  }
}

}  // namespace

bool recording_input_reads() { return t_recording_input_reads; }

Frame::~Frame() {
  if (live) remove_live_frame(this);
}

void Frame::make_live() {
  add_live_frame(this);
  live = true;
}

std::string Frame::region_path(const std::string& name) const {
  return alloc::region_path(options.region_name, name);
}

void Frame::persist(const at::Tensor& t, bool by_read) {
  const c10::StorageImpl* storage = storage_of(t);
  if (storage == nullptr) return;
  for (SaveRegionRecord& region : save_regions) {
    for (std::size_t o = 0; o < region.outputs.size(); ++o) {
      if (storage_of(region.outputs[o]) != storage) continue;
      if (!region.persisted[o]) {
        region.persisted[o] = true;
        --outputs_not_persisted;
        region.read_at[o] = by_read ? slots() : SaveRegionRecord::kNotOnlyRead;
      } else if (!by_read) {
        region.read_at[o] = SaveRegionRecord::kNotOnlyRead;
      }
      // Claimed for good (not only read, which forward's end may undo): packed now, where the
      // claim happens, as torch_remat's deferred pack; forward still holds the output itself.
      if (!by_read && region.hooks && !region.packed[o]) {
        const std::string path = region_path(region.name);
        region.packed[o] = PackedTensor(region.hooks, region.outputs[o].detach(),
                                        {SavedTensorKind::save_output, &region.hooks_context, false, this, path});
      }
    }
  }
}

void Frame::note_read_in_save_region(const at::Tensor& t) {
  if (const c10::StorageImpl* storage = storage_of(t)) record_input_read(*this, storage);
}

void Frame::note_read(const at::Tensor& t) {
  if (!observing_needed()) return;
  const c10::StorageImpl* storage = storage_of(t);
  if (storage == nullptr) return;
  if (t_recording_input_reads) record_input_read(*this, storage);
  if (outputs_not_persisted != 0) persist(t, /*by_read=*/true);  // recompute runs the reading code again
  if (inputs_not_read != 0) {
    for (InputRecord& input : inputs) {
      if (!input.needed && storage_of(input.value) == storage) {
        input.needed = true;
        --inputs_not_read;
      }
    }
  }
  if (!observing_needed()) stop_observing_reads();
}

void Frame::observe_reads_if_needed() {
  if (read_observer != 0 || !observing_needed()) return;
  read_observer = at::addThreadLocalCallback(
      at::RecordFunctionCallback(observe_op).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

void Frame::stop_observing_reads() {
  // Safe from inside the observer: a running op keeps its own copy of the callbacks.
  if (read_observer != 0) at::removeCallback(std::exchange(read_observer, 0));
}

void Frame::note_forward_reads(const TensorList& outputs) {
  if (slots() == 0) return;  // nothing to recompute
  forward_span = NodeSpan::up_to_now(sequence_at_entry);
  // Recompute runs again the nodes made outside save regions (and in those it runs again) up to
  // the last one that saved a dropped tensor (it stops there).
  auto runs_again = [&](std::uint64_t node) {
    if (node >= sequence_at_last_drop) return false;
    for (const SaveRegionRecord& region : save_regions) {
      // Under a plan any save region may run again (rerun_save_regions_changed_after_forward).
      if (region.rerun_reason.empty() && !options.plan && node >= region.first_node && node < region.end_node) {
        return false;
      }
    }
    return true;
  };
  // From the outputs and from each tensor recompute recreates, as recompute's graph is walked: a
  // side branch (an auxiliary loss kept aside, a probe) is read again too.
  std::vector<std::shared_ptr<torch::autograd::Node>> producers;
  for (const DroppedMeta& meta : dropped_metas) producers.push_back(meta.producer.node.lock());
  for (const FerriedTensor& slot : ferried) producers.push_back(slot.producer.node.lock());
  std::vector<const torch::autograd::Node*> roots;
  for (const auto& producer : producers) roots.push_back(producer.get());
  for (const at::Tensor& out : outputs) {
    if (out.defined()) roots.push_back(out.grad_fn().get());
  }
  // The checkpoint's inputs are given to recompute as leaves of its own: what computed them is not
  // read again.
  std::vector<const torch::autograd::Node*> inputs_made_by;
  for (const InputRecord& input : inputs) {
    if (input.given_grad_fn != nullptr) inputs_made_by.push_back(input.given_grad_fn);
  }
  // Each parameter noted once: looked up in a list while short, then in a set.
  std::vector<const c10::TensorImpl*> noted;
  std::unordered_set<const c10::TensorImpl*> noted_set;
  auto first_note = [&](const c10::TensorImpl* leaf) {
    constexpr std::size_t kListed = 32;
    if (noted.size() < kListed) {
      if (std::find(noted.begin(), noted.end(), leaf) != noted.end()) return false;
      noted.push_back(leaf);
      return true;
    }
    if (noted_set.empty()) noted_set.insert(noted.begin(), noted.end());
    return noted_set.insert(leaf).second;
  };
  std::vector<c10::intrusive_ptr<c10::TensorImpl>> leaves;
  walk_outside_reads(
      forward_span, roots,
      [&](const torch::autograd::Node& reader, std::uint32_t input,
          const std::shared_ptr<torch::autograd::Node>& read) {
        if (!runs_again(reader.sequence_nr()) ||
            std::find(inputs_made_by.begin(), inputs_made_by.end(), read.get()) != inputs_made_by.end()) {
          return;
        }
        forward_reads.push_back(OutsideRead::of(reader, input, read));
        const auto* leaf = dynamic_cast<const torch::autograd::AccumulateGrad*>(read.get());
        if (leaf == nullptr || !first_note(leaf->variable.unsafeGetTensorImpl())) return;
        leaves.push_back(leaf->variable.getIntrusivePtr());
        const c10::VariableVersion& version = leaf->variable.unsafeGetTensorImpl()->version_counter();
        if (version.enabled()) {
          read_parameters.push_back({DroppedMeta::of(leaf->variable, -1), version, version.current_version()});
        }
      });
  note_leaves_forwards_read(leaves);
}

void Frame::check_read_again_unchanged() const {
  auto refuse = [&](const std::string& what, std::uint32_t then, std::uint32_t now) {
    return Error(what + " was changed by an in-place operation after forward (version " + std::to_string(then) +
                 ", now " + std::to_string(now) +
                 "); recompute would read the changed value and give wrong gradients: change parameters and other "
                 "tensors the checkpoint reads only after backward (optimizer.step() after loss.backward()), or make "
                 "that operation out-of-place");
  };
  // A kept save-region output is named as such first: a tensor read from it was saved and dropped
  // too. (One recompute runs again remakes it.)
  for (const SaveRegionRecord& record : save_regions) {
    if (record.rerun_reason.empty()) refuse_outputs_changed_after_forward(record, region_path(record.name));
  }
  for (const DroppedVersion& saved : dropped_versions) {
    if (saved.version.current_version() == saved.version_at_save) continue;
    const DroppedMeta& meta = dropped_metas[saved.index];
    if (saved.version_at_forward_end != saved.version_at_save) {
      // Changed inside the body, after an operation saved it: autograd refuses that without checkpointing too
      throw Error(
          "a tensor that " + where(meta.region) + " saved for backward (saved tensor #" + std::to_string(saved.index) +
          ", " + meta.describe() + ") was changed by an in-place operation later in the same forward (version " +
          std::to_string(saved.version_at_save) + " when saved, " + std::to_string(saved.version_at_forward_end) +
          " as forward ended), as autograd refuses without checkpointing too: make that operation "
          "out-of-place (b = b * 2 rather than b.mul_(2)), or change a clone");
    }
    throw refuse("a tensor that " + where(meta.region) + " read (saved tensor #" + std::to_string(saved.index) + ", " +
                     meta.describe() + ")",
                 saved.version_at_save, saved.version.current_version());
  }
  for (const ReadParameter& parameter : read_parameters) {
    if (parameter.version.current_version() == parameter.version_at_forward) continue;
    throw refuse("a parameter (a leaf that requires grad, " + parameter.meta.describe() + ") that checkpoint '" +
                     options.region_name + "' read",
                 parameter.version_at_forward, parameter.version.current_version());
  }
}

void Frame::rerun_save_regions_changed_after_forward() {
  if (!options.plan) return;
  for (SaveRegionRecord& region : save_regions) {
    if (!region.rerun_reason.empty()) continue;
    const std::optional<std::size_t> changed = output_changed_after_forward(region);
    if (!changed) continue;
    const bool inputs_held = std::all_of(region.checkpoint_inputs.begin(), region.checkpoint_inputs.end(),
                                         [&](std::size_t i) { return inputs[i].held(); });
    if (!inputs_held) continue;
    region.rerun_reason = "its output " + std::to_string(*changed) +
                          " was changed in place after the checkpoint returned: recompute runs it again";
  }
}

std::string same_path_advice() {
  return "the body must take the same path in recompute as in forward (branch on " + api_name("is_recomputing") +
         "() only for work autograd does not save, and run it under the same autocast and grad modes, with its "
         "modules in the same training mode and the same parameters requiring grad: model.eval() between forward "
         "and backward changes what dropout and batch norm save, and requires_grad_(False) on a layer what its ops "
         "save)";
}

std::string Frame::where(int region) const {
  if (region < 0 || static_cast<std::size_t>(region) >= regions.size()) {
    return "the body of checkpoint '" + options.region_name + "'";
  }
  return "region '" + region_path(regions[static_cast<std::size_t>(region)].name) + "'";
}

void Frame::release_after_failed_forward() {
  forward_failed = true;
  stop_observing_reads();
  inputs.clear();
  save_regions.clear();
  kept.clear();
  pending_names.clear();
  fingerprints.clear();
  dropped_metas.clear();
  dropped_versions.clear();
  read_parameters.clear();
  forward_reads.clear();
  contexts.clear();
  body = nullptr;  // a Python body holds its closure, which may hold the graph
  options.recompute_state_hooks.clear();
  options.contexts.clear();
  options.saved_tensor_hooks = nullptr;  // a Python pair's closure may hold the graph too
  recreated_region_inputs.clear();
  ferried.clear();
  input_hooks = nullptr;
  input_hooks_context.reset();
  state_at_entry.clear();
}

void Frame::note_recreated_region_inputs(const TensorList& region_inputs) {
  recreated_region_inputs.clear();
  auto kept_by_the_checkpoint = [&](const c10::StorageImpl* storage) {
    for (const InputRecord& input : inputs) {
      if (storage_of(input.value) == storage) return true;
    }
    for (const SaveRegionRecord& region : save_regions) {
      for (const at::Tensor& output : region.outputs) {
        if (storage_of(output) == storage) return true;
      }
    }
    return false;
  };
  for (std::size_t i = 0; i < region_inputs.size(); ++i) {
    const at::Tensor& input = region_inputs[i];
    // Made by differentiable code in the checkpoint outside save regions, which recompute runs
    // again: not a parameter, a constant, a checkpoint input or a save region's output.
    if (!input.defined() || !input.requires_grad() || input.is_leaf()) continue;
    const c10::StorageImpl* storage = storage_of(input);
    if (storage == nullptr || kept_by_the_checkpoint(storage)) continue;
    recreated_region_inputs.emplace_back(i, input);
  }
}

std::optional<std::size_t> Frame::ferry(const at::Tensor& t, int save_region, bool may_keep, const std::string& name) {
  if (recreated_region_inputs.empty()) return std::nullopt;
  const c10::StorageImpl* storage = storage_of(t);
  for (const auto& [index, input] : recreated_region_inputs) {
    if (storage_of(input) != storage) continue;
    ferried.push_back(
        {save_region, index, meta_of(input), meta_of(t), t.is_conj() != input.is_conj(), t.is_neg() != input.is_neg(),
         may_keep ? std::make_shared<at::Tensor>(t.variable_data()) : nullptr, name, SavedProducer::of(input)});
    return ferried.size() - 1;
  }
  return std::nullopt;
}

void Frame::fill_ferried(int save_region, const TensorList& region_inputs) {
  for (std::size_t k = 0; k < ferried.size(); ++k) {
    const FerriedTensor& slot = ferried[k];
    if (slot.save_region != save_region || filled[dropped + k]) continue;
    const at::Tensor& input = region_inputs.at(slot.input);
    const TensorMeta now = meta_of(input);
    if (now.sizes != slot.input_meta.sizes || now.strides != slot.input_meta.strides ||
        now.storage_offset != slot.input_meta.storage_offset || now.storage_bytes != slot.input_meta.storage_bytes ||
        now.options.dtype() != slot.input_meta.options.dtype()) {
      throw Error("recompute of checkpoint '" + options.region_name + "' gave input " + std::to_string(slot.input) +
                  " of save region '" + region_path(save_regions[static_cast<std::size_t>(save_region)].name) +
                  "' a different layout than forward did (sizes, strides, offset or storage size), so the tensor "
                  "the region saved from it cannot be taken from it again; the body must take the same path in "
                  "recompute as in forward");
    }
    at::Tensor saved = input.variable_data().as_strided(slot.saved_meta.sizes, slot.saved_meta.strides,
                                                        slot.saved_meta.storage_offset);
    if (slot.conjugate_flipped) saved = at::_conj(saved);
    if (slot.negative_flipped) saved = at::_neg_view(saved);
    recreated[dropped + k] = std::move(saved);
    filled[dropped + k] = true;
    --missing;
  }
  if (missing == 0 && stop_early) stop_recompute(*this);
}

void Frame::recompute_before_unpacks() {
  std::lock_guard lock(backward_mutex);
  if (forward_finished && taken_since_recompute == 0) recompute();  // returns at once when nothing is missing
}

at::Tensor Frame::take_recreated(std::size_t index) {
  std::lock_guard lock(backward_mutex);
  if (!forward_finished && !forward_failed) {
    throw Error("checkpoint '" + options.region_name +
                "': autograd ran backward through a tensor the checkpoint dropped while its forward was still "
                "running (torch.autograd.grad or .backward() inside the body, as for a gradient penalty or an "
                "auxiliary loss); the checkpoint drops what autograd saves outside save regions as it is saved, and "
                "can recompute it only once the body has returned: run the ops that inner backward goes through, "
                "with the autograd call, in one save region (" + api_name("region") +
                "(fn, name, recompute=False)), or take that gradient outside the checkpoint");
  }
  if (!forward_finished) {
    throw Error("checkpoint '" + options.region_name +
                "' raised an error in forward, so the tensors it dropped cannot be recomputed; backward cannot run "
                "through tensors made inside a failed checkpoint: drop them, or run the work outside the checkpoint");
  }
  if (index >= filled.size()) {
    throw Error("checkpoint '" + options.region_name + "': saved tensor " + std::to_string(index) +
                " is out of range; this is a bug in remat");
  }
  if (!filled[index]) recompute();
  ++taken_since_recompute;
  at::Tensor out = std::move(recreated[index]);
  recreated[index] = at::Tensor();
  filled[index] = false;  // freed as backward consumes it; a second backward recomputes
  return out;
}

void Frame::recompute() {
  std::vector<std::size_t> to_fill;
  for (std::size_t i = 0; i < filled.size(); ++i) {
    if (!filled[i]) to_fill.push_back(i);
  }
  missing = to_fill.size();
  if (missing == 0) return;
  try {
    recompute_slots(to_fill);
  } catch (...) {
    // What this recompute made holds its graph, whose saved-tensor hooks hold this frame: let go.
    for (const std::size_t i : to_fill) {
      recreated[i] = at::Tensor();
      filled[i] = false;
    }
    held_as_recompute_began.clear();
    throw;
  }
}

void Frame::recompute_slots(const std::vector<std::size_t>& to_fill) {
  taken_since_recompute = 0;
  given_by_skipped_save_regions.clear();
  recompute_packs = 0;
  recompute_regions = 0;
  recompute_mismatch.reset();

  rerun_save_regions_changed_after_forward();
  const auto& hooks = options.recompute_state_hooks;
  const std::vector<std::any> outer = snapshot_states(hooks);
  restore_states(hooks, state_at_entry);

  TensorList args;
  args.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const InputRecord& input = inputs[i];
    if (input.held() && input.changed_in_place()) {
      restore_states(hooks, outer);
      throw Error("input " + std::to_string(i) + " of checkpoint '" + options.region_name +
                  "' was changed by an in-place operation after forward (version " +
                  std::to_string(input.version_at_entry) + ", now " + std::to_string(input.version.current_version()) +
                  "); recompute would read the changed value and give wrong gradients: make that operation "
                  "out-of-place (h = h + y instead of h += y), or pass the checkpoint a copy");
    }
    auto source = [&] { return "input " + std::to_string(i) + " of checkpoint '" + options.region_name + "'"; };
    at::Tensor arg = !input.held()  ? make_placeholder(input.meta, source())
                     : input.packed ? restore_layout(input.packed.unpack(), input.meta, source())
                                    : input.value.variable_data();
    // Forward's flag, held or not: code may branch on it (a fused kernel's inference path), and
    // autograd saves other tensors for an op whose inputs need no gradient.
    if (input.meta.requires_grad) arg.requires_grad_(true);
    args.push_back(std::move(arg));
  }

  sequence_at_recompute = at::sequence_number::peek();
  try {
    check_read_again_unchanged();
  } catch (const Error&) {
    restore_states(hooks, outer);
    throw;
  }

  // A checkpoint keeping no state (no RNG state hook) whose recompute draws random numbers draws
  // others than forward did: said, not silent
  const std::optional<GeneratorMarks> generators_before =
      hooks.empty() ? std::optional(generator_marks()) : std::nullopt;
  {
    FrameOwnerScope owner(shared_from_this());
    ForwardModesScope modes_scope(modes);
    ThreadStateScope scope({this, Mode::recompute, -1, false, nullptr, user_hooks_depth()});
    ContextScope context_scope(contexts, /*recompute=*/true);
    auto region_tag = alloc::TagScope::region(options.region_name);
    auto phase_tag = alloc::TagScope::phase(alloc::Phase::recompute);
    at::AutoGradMode grad(true);
    CallerScope caller(options.caller.get());
    // The buffers the body changed in forward, as forward read them while it runs, as found after
    struct PutBackWrittenBuffers {
      WrittenBuffers& buffers;
      ~PutBackWrittenBuffers() { buffers.recompute_ended(); }
    } put_back{written_buffers};
    written_buffers.recompute_began();
    body_starting = true;
    try {
      body(args);
      body_starting = false;
    } catch (const std::exception& e) {
      body_starting = false;
      // The stop (StopRecompute, or what the raiser set with set_recompute_stop_raiser()
      // throws in its place: a Python exception, for a Python body): every tensor backward
      // needs exists, so the rest of the body need not run.
      if (recompute_mismatch) {
        restore_states(hooks, outer);
        throw Error(*recompute_mismatch);
      }
      const bool stopped = missing == 0 && stop_early;
      auto placeholder_read = placeholder_error_of(e);
      // Work after the last needed tensor that built no graph node (so no early stop was
      // planned) may read a placeholder; its results are discarded anyway.
      if (!stopped && (!placeholder_read || missing != 0)) {
        restore_states(hooks, outer);
        if (placeholder_read) throw Error(*placeholder_read);
        throw;
      }
    }
    context_scope.close();
  }
  restore_states(hooks, outer);
  if (generators_before && !same_generator_marks(*generators_before, generator_marks())) {
    warn_of_random_draws(options.region_name);
  }
  if (missing != 0) {
    throw Error("recompute of checkpoint '" + options.region_name + "' recreated " + std::to_string(recompute_packs) +
                " saved tensors but forward saved " + std::to_string(dropped) + "; " + same_path_advice());
  }
  refuse_reads_forward_did_not_make(to_fill, args);
  held_as_recompute_began.clear();
}

void Frame::refuse_reads_forward_did_not_make(const std::vector<std::size_t>& filled_now,
                                              const TensorList& args) const {
  const NodeSpan span = NodeSpan::up_to_now(sequence_at_recompute);
  std::vector<const torch::autograd::Node*> roots;
  for (const std::size_t index : filled_now) {
    const SavedProducer& forward_made_by =
        index < dropped ? dropped_metas[index].producer : ferried[index - dropped].producer;
    const at::Tensor& tensor = recreated[index];
    if (tensor.defined() && !forward_made_by.died()) roots.push_back(tensor.grad_fn().get());
  }
  std::vector<OutsideRead> reads;
  const std::vector<const torch::autograd::Node*> nodes =
      walk_outside_reads(span, roots,
                         [&](const torch::autograd::Node& reader, std::uint32_t input,
                             const std::shared_ptr<torch::autograd::Node>& read) {
                           reads.push_back(OutsideRead::of(reader, input, read));
                         });
  // The checkpoint's inputs, as forward and recompute were given them, and what skipped save regions
  // gave recompute.
  std::vector<const c10::TensorImpl*> leaves_given = given_by_skipped_save_regions;
  for (const InputRecord& input : inputs) leaves_given.push_back(input.given);
  for (const at::Tensor& arg : args) {
    if (arg.defined()) leaves_given.push_back(arg.unsafeGetTensorImpl());
  }
  if (auto elsewhere = recompute_read_elsewhere(forward_reads, forward_span, reads, nodes, span, leaves_given,
                                                held_as_recompute_began)) {
    throw Error(swapped_weights_error(options.region_name, *elsewhere));
  }
}

}  // namespace remat::detail

namespace remat {

void record_input_reads(bool on) {
  detail::t_recording_input_reads = on;
  detail::t_input_reads.clear();
  detail::t_ops_watched_in_save_regions = 0;
  detail::t_collectives.clear();
}

std::vector<std::uintptr_t> take_input_reads() { return std::exchange(detail::t_input_reads, {}); }

std::size_t take_ops_watched_in_save_regions() { return std::exchange(detail::t_ops_watched_in_save_regions, 0); }

std::vector<std::string> take_collectives() { return std::exchange(detail::t_collectives, {}); }

}  // namespace remat
