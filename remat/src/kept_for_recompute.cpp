// What a checkpoint keeps for recompute when its forward ends (kept_for_recompute.hpp).

#include "kept_for_recompute.hpp"

#include "carried_state.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/errors.hpp>
#include <remat/saved_tensor_hooks.hpp>

#include <algorithm>
#include <cstdint>
#include <unordered_set>
#include <utility>

namespace remat::detail {
namespace {

// What a checkpoint keeps for recompute is, for tracking (remat_alloc.track), an activation of
// the module that made it, as what autograd saves is: where a category is in force on the thread
// and the storage is still unnamed or a temporary. A parameter stays what it is. (A hook pair in
// force names what passes it itself.)
void name_kept_an_activation(const at::Tensor& kept) {
  if (!alloc::category_in_force() || !kept.defined() || !kept.has_storage()) return;
  const at::TensorBase& base = kept.is_view() ? kept._base() : kept;
  if (base.is_leaf() && base.requires_grad()) return;
  try {
    alloc::categorize_as_activation(kept.storage().data());
  } catch (const c10::Error&) {  // a tensor subclass without accessible storage: left as it is
  }
}

// A save region recompute runs again needs the checkpoint inputs it read, and none of its
// outputs: recompute makes them again.
void prepare_rerun(Frame& frame, SaveRegionRecord& region) {
  for (const std::size_t i : region.checkpoint_inputs) {
    InputRecord& input = frame.inputs[i];
    if (input.needed) continue;
    input.needed = true;
    --frame.inputs_not_read;
  }
  for (std::size_t o = 0; o < region.outputs.size(); ++o) {
    region.persisted[o] = false;
    region.packed[o] = PackedTensor();
  }
}

using Storages = std::unordered_set<const c10::StorageImpl*>;

// The bytes of `storages` not in `kept_anyway`.
std::int64_t bytes_beyond(const Storages& storages, const Storages& kept_anyway) {
  std::int64_t bytes = 0;
  for (const c10::StorageImpl* storage : storages) {
    if (!kept_anyway.contains(storage)) bytes += static_cast<std::int64_t>(storage->nbytes());
  }
  return bytes;
}

// Where recompute would run for the ferried tensors alone: whether keeping them keeps no more than
// recompute needs to make them again (the inputs code outside save regions reads, the save-region
// outputs it reads before the last of them), counting storages the checkpoint keeps anyway (what
// save regions keep, outputs another region consumes) at nothing.
bool keeping_ferried_costs_no_more(const Frame& frame) {
  Storages kept_anyway, for_recompute, ferried;
  auto add = [](Storages& set, const at::Tensor& t) {
    if (const c10::StorageImpl* storage = storage_of(t)) set.insert(storage);
  };
  for (const KeptTensor& kept : frame.kept) {
    if (auto impl = kept.tensor.lock()) add(kept_anyway, at::Tensor(std::move(impl)));
  }
  for (const SaveRegionRecord& region : frame.save_regions) {
    for (std::size_t o = 0; o < region.outputs.size(); ++o) {
      if (!region.persisted[o]) continue;
      const bool only_read = region.read_at[o] != SaveRegionRecord::kNotOnlyRead;
      if (!only_read) add(kept_anyway, region.outputs[o]);
      if (only_read && region.read_at[o] < frame.slots()) add(for_recompute, region.outputs[o]);
    }
  }
  for (const InputRecord& input : frame.inputs) {
    if (input.needed) add(for_recompute, input.value);
  }
  for (const FerriedTensor& slot : frame.ferried) add(ferried, *slot.held);
  return bytes_beyond(ferried, kept_anyway) <= bytes_beyond(for_recompute, kept_anyway);
}

}  // namespace

void keep_ferried_where_nothing_else_is_recomputed(Frame& frame) {
  const bool keep = frame.dropped == 0 && !frame.ferried.empty() &&
                    std::all_of(frame.ferried.begin(), frame.ferried.end(),
                                [](const FerriedTensor& slot) { return slot.held != nullptr; }) &&
                    keeping_ferried_costs_no_more(frame);
  for (FerriedTensor& slot : frame.ferried) {
    if (!slot.held) continue;
    if (keep) {
      name_kept_an_activation(*slot.held);
      frame.kept.push_back(
          {slot.save_region, slot.name, /*parameter=*/false, /*leaf_cast=*/false,
           c10::weak_intrusive_ptr<c10::TensorImpl>(slot.held->getIntrusivePtr())});
    } else {
      *slot.held = at::Tensor();  // the hook's copy too: recompute makes it again
    }
    slot.held.reset();  // the hook alone holds what is kept
  }
  if (keep) frame.ferried.clear();
}

void settle_needed_inputs(Frame& frame) {
  if (frame.slots() != 0) return;
  for (InputRecord& input : frame.inputs) input.needed = false;
}

void keep_needed_inputs(Frame& frame) {
  for (InputRecord& input : frame.inputs) {
    if (input.needed && frame.input_hooks) {
      const at::TensorBase& base = input.value.is_view() ? input.value._base() : input.value;
      input.packed = PackedTensor(frame.input_hooks, input.value.detach(),
                                  {SavedTensorKind::checkpoint_input, &frame.input_hooks_context,
                                   base.is_leaf() && base.requires_grad(), &frame, frame.options.region_name});
      input.value = at::Tensor();
    } else if (input.needed) {
      name_kept_an_activation(input.value);
      input.value = input.value.variable_data();
    } else {
      input.value = at::Tensor();
    }
  }
}

void settle_persisted_outputs(Frame& frame) {
  for (SaveRegionRecord& region : frame.save_regions) {
    for (std::size_t o = 0; o < region.outputs.size(); ++o) {
      // Read only by code after recompute's last slot (a tensor dropped or ferried): recompute
      // stops before it (or, when it runs on, discards what that code computes), so no value is
      // needed there.
      if (region.read_at[o] != SaveRegionRecord::kNotOnlyRead && region.read_at[o] >= frame.slots()) {
        region.persisted[o] = false;
      }
      if (!region.persisted[o] || version_of(region.outputs[o]) == region.versions[o]) continue;
      if (!frame.options.plan) {
        throw Error("output " + std::to_string(o) + " of save region '" + frame.region_path(region.name) +
                    "' was changed in place after the region returned (an op such as h.mul_(2) or h += y); "
                    "recompute hands back the saved output and would apply the change twice: make that op "
                    "out-of-place, or make the region a recompute region");
      }
      if (region.rerun_reason.empty()) {
        region.rerun_reason = "its output " + std::to_string(o) +
                              " is changed in place after it returns (an op such as h += x): recompute runs it again";
      }
    }
    if (!region.rerun_reason.empty()) prepare_rerun(frame, region);
  }
}

void keep_persisted_outputs(Frame& frame) {
  for (SaveRegionRecord& region : frame.save_regions) {
    for (std::size_t o = 0; o < region.outputs.size(); ++o) {
      if (region.persisted[o] && region.hooks && plain_strided(region.outputs[o])) {
        if (!region.packed[o]) {  // persisted only because code recompute runs again reads it
          const std::string path = frame.region_path(region.name);
          region.packed[o] = PackedTensor(region.hooks, region.outputs[o].detach(),
                                          {SavedTensorKind::save_output, &region.hooks_context, false, &frame, path});
        }
        region.outputs[o] = at::Tensor();
      } else {
        if (region.persisted[o]) name_kept_an_activation(region.outputs[o]);
        region.outputs[o] = region.persisted[o] ? region.outputs[o].variable_data() : at::Tensor();
      }
    }
  }
}

bool made_in_checkpoint(const Frame& frame, const at::Tensor& t) {
  return t.defined() && t.grad_fn() != nullptr && t.grad_fn()->sequence_nr() >= frame.sequence_at_entry;
}

std::string rerun_for_changed_inputs(const Frame& frame, const std::string& name, const TensorList& inputs,
                                     const std::vector<std::optional<std::uint32_t>>& input_versions,
                                     const std::vector<bool>& made_here) {
  std::string reason;
  for (std::size_t i = 0; i < input_versions.size(); ++i) {
    if (input_versions[i] == version_of(inputs[i])) continue;
    if (!frame.options.plan) {
      throw Error("save region '" + frame.region_path(name) + "' changed its input " + std::to_string(i) +
                  " in place (an op such as LeakyReLU(inplace=True) or x.relu_()); recompute skips save regions, so "
                  "the change would not happen again and what follows would read the unchanged value: make the op "
                  "out-of-place, or make the region a recompute region");
    }
    if (!made_here[i]) {
      throw Error("region '" + frame.region_path(name) + "' changed its input " + std::to_string(i) +
                  " in place (an op such as x.relu_()), a tensor made before the checkpoint ran or without "
                  "gradients (a buffer, a captured tensor): saved, recompute would skip the change; recomputed, it "
                  "would make it twice. Make the op out-of-place, or pass the region a tensor the checkpoint makes");
    }
    if (reason.empty()) {
      reason = "it changes its input " + std::to_string(i) +
               " in place (an op such as ReLU(inplace=True)): recompute runs it again";
    }
  }
  return reason;
}

void record_save_region(Frame& frame, const std::string& name, const TensorList& inputs, const TensorList& outputs,
                        std::uint64_t first_node, std::uint64_t end_node, std::shared_ptr<void>* annotation,
                        std::string rerun_reason) {
  SaveRegionRecord record;
  record.name = name;
  for (const at::Tensor& input : inputs) {
    const c10::StorageImpl* storage = storage_of(input);
    if (storage == nullptr) continue;
    for (std::size_t i = 0; i < frame.inputs.size(); ++i) {
      if (storage_of(frame.inputs[i].value) == storage) record.checkpoint_inputs.push_back(i);
    }
  }
  record.rerun_reason = std::move(rerun_reason);
  for (const at::Tensor& out : outputs) record.metas.push_back(meta_of(out));
  record.outputs = outputs;
  // An output the runtime cannot follow by its storage nor make a placeholder of (sparse, nested)
  // is kept as it is
  for (const at::Tensor& out : outputs) record.persisted.push_back(out.defined() && !plain_strided(out));
  record.packed.resize(outputs.size());
  record.hooks = active_saved_tensor_hooks();
  if (record.hooks && record.hooks->captures_context()) record.hooks_context = record.hooks->capture_context();
  record.read_at.assign(outputs.size(), SaveRegionRecord::kNotOnlyRead);
  frame.outputs_not_persisted +=
      static_cast<std::size_t>(std::count(record.persisted.begin(), record.persisted.end(), false));
  for (const at::Tensor& out : outputs) {
    record.versions.push_back(version_of(out));
    record.version_counters.push_back(out.defined() ? out.unsafeGetTensorImpl()->version_counter()
                                                    : c10::VariableVersion(c10::VariableVersion::DISABLED));
  }
  record.state_after = snapshot_states(frame.options.recompute_state_hooks);
  frame.written_buffers.save_region_ended(frame.save_regions.size());
  record.first_node = first_node;
  record.end_node = end_node;
  if (annotation != nullptr) record.annotation = *annotation;
  frame.save_regions.push_back(std::move(record));
  frame.observe_reads_if_needed();
}

TensorList outputs_of_skipped_save_region(Frame& frame, int save_index, const std::string& name,
                                          const TensorList& inputs, std::shared_ptr<void>* annotation) {
  const SaveRegionRecord& record = frame.save_regions[static_cast<std::size_t>(save_index)];
  restore_states(frame.options.recompute_state_hooks, record.state_after);
  frame.written_buffers.save_region_skipped(static_cast<std::size_t>(save_index));
  frame.fill_ferried(save_index, inputs);
  if (annotation != nullptr) *annotation = record.annotation;
  refuse_outputs_changed_after_forward(record, frame.region_path(name));
  TensorList out;
  for (std::size_t o = 0; o < record.metas.size(); ++o) {
    if (record.packed[o] || record.outputs[o].defined()) {
      at::Tensor value =
          record.packed[o]
              ? restore_layout(record.packed[o].unpack(), record.metas[o],
                               "output " + std::to_string(o) + " of save region '" + frame.region_path(name) + "'")
              : record.outputs[o].variable_data();
      if (record.metas[o].requires_grad) value.requires_grad_(true);
      frame.given_by_skipped_save_regions.push_back(value.unsafeGetTensorImpl());
      out.push_back(std::move(value));
    } else {
      out.push_back(make_placeholder(
          record.metas[o], "output " + std::to_string(o) + " of save region '" + frame.region_path(name) + "'"));
    }
  }
  return out;
}

}  // namespace remat::detail
