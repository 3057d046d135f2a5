#pragma once
// What a checkpoint's frame records as forward runs, plain data that recompute and the reports
// read: per input and per save region what is kept, per saved tensor what was kept or dropped,
// and for each dropped tensor what recompute must recreate in its place.

#include "placeholder.hpp"

#include <remat/saved_tensor_hooks.hpp>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <any>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace remat::detail {

// The node that made a tensor forward saved (its grad_fn), held weakly: recompute's graph is
// compared with forward's from what it recreated only where forward's node still lives (where it
// died, a side branch dropped in forward, nothing will read what recompute made there).
struct SavedProducer {
  std::weak_ptr<torch::autograd::Node> node;
  bool made_by_a_node = false;  // false for a leaf
  static SavedProducer of(const at::TensorBase& t) {
    const std::shared_ptr<torch::autograd::Node>& grad_fn = t.grad_fn();
    return {grad_fn, grad_fn != nullptr};
  }
  bool died() const { return made_by_a_node && node.expired(); }
};

struct InputRecord {
  TensorMeta meta;
  at::Tensor value;     // held during forward; afterwards only when recompute needs it
  bool needed = false;  // read by code that runs again in recompute
  PackedTensor packed;  // in place of value after forward, when the checkpoint has a hook pair
  // The caller's tensor's version counter (value's own is a new one once forward ends): an
  // in-place change would make recompute read a different value, which autograd refuses too.
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  std::uint32_t version_at_entry = 0;
  // The caller's tensor and its grad_fn, compared by identity only (the grad_fn while forward runs).
  const c10::TensorImpl* given = nullptr;
  const torch::autograd::Node* given_grad_fn = nullptr;
  // Whether the caller's tensor changed in place since forward began (false when its
  // version counter is disabled, as for inference tensors).
  bool changed_in_place() const { return version.enabled() && version.current_version() != version_at_entry; }
  bool held() const { return value.defined() || static_cast<bool>(packed); }
};

struct SaveRegionRecord {
  std::string name;
  std::vector<TensorMeta> metas;
  std::vector<at::Tensor> outputs;  // held during forward; afterwards only the persisted ones
  std::vector<bool> persisted;
  // The hook pair in force where the region ran and its captured context: persisted outputs
  // are packed through it when forward ends (packed[o] then stands in for outputs[o]).
  std::shared_ptr<SavedTensorHooks> hooks;
  std::any hooks_context;
  std::vector<PackedTensor> packed;
  // Per output persisted only because code that recompute runs again read it: the number of
  // recompute's slots (tensors dropped or ferried) when it was first read, kNotOnlyRead when
  // something else needs it. Recompute stops once its last slot is filled, before code that read
  // the output after every slot was made.
  static constexpr std::size_t kNotOnlyRead = static_cast<std::size_t>(-1);
  std::vector<std::size_t> read_at;
  std::vector<std::optional<std::uint32_t>> versions;  // of the outputs when the region returned
  // The outputs' own version counters (what is held after forward has new ones): a persisted
  // output changed in place between forward and backward would hand recompute another value.
  std::vector<c10::VariableVersion> version_counters;
  std::vector<std::any> state_after;  // state hook snapshots after the region ran
  // Autograd's sequence numbers of the graph nodes the region made: [first_node, end_node).
  std::uint64_t first_node = 0, end_node = 0;
  std::shared_ptr<void> annotation;  // the caller's, see run_region
  // Why recompute runs the region's body again instead of skipping it; empty where it skips it.
  // Under a plan, a save region that changed its input in place, or whose output was changed in
  // place after it returned: skipped, recompute would miss the change or make it twice. Run
  // again, it makes the change again; what it saves for backward stays what forward kept.
  std::string rerun_reason;
  // The checkpoint inputs it read (by storage): recompute needs them where it runs again.
  std::vector<std::size_t> checkpoint_inputs;
};

// The first output forward kept of a save region that was changed in place since the region
// returned, if one was: recompute would hand back the changed value.
std::optional<std::size_t> output_changed_after_forward(const SaveRegionRecord& record);
// Refuses recompute where output_changed_after_forward names one, naming the region at `path`.
void refuse_outputs_changed_after_forward(const SaveRegionRecord& record, const std::string& path);

struct KeptTensor {
  int save_region = -1;
  std::string name;  // given with name_saved_tensors(); "" for "saved.<i>"
  // A parameter (a leaf that requires grad) or a view of one, such as the weight.t() a matmul
  // saves: resident whatever the checkpoint does, so reports leave it out.
  bool parameter = false;
  // A cast of a leaf that requires grad, or a view of one (ResidentTensor::leaf_cast): autocast's
  // cache holds it until its block ends. Known only where it was saved: the runtime holds it
  // without its graph.
  bool leaf_cast = false;
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor{c10::intrusive_ptr<c10::TensorImpl>()};
};

// A tensor a save region saved that is (a view of) one of its inputs recompute recreates:
// forward does not keep it; recompute takes it from that input as it reaches the skipped
// region (torch_remat re-derives such inputs the same way).
struct FerriedTensor {
  int save_region = -1;
  std::size_t input = 0;  // the region's input it shares a storage with
  TensorMeta input_meta;  // that input's layout in forward: recompute's must be the same
  TensorMeta saved_meta;  // the saved tensor's sizes, strides and offset in that storage
  // Whether the saved tensor's conjugate and negative bits differ from the input's (it was
  // x.conj() or a negative view of x): what recompute takes is flipped the same way.
  bool conjugate_flipped = false;
  bool negative_flipped = false;
  // The tensor as saved, shared with its saved-variable hook until forward ends: kept instead where
  // recompute would run for such tensors alone (keep_ferried_where_nothing_else_is_recomputed),
  // else emptied. Null when a hook pair was in force: then it is always taken from the input.
  std::shared_ptr<at::Tensor> held;
  std::string name;  // given with name_saved_tensors(), for reports
  SavedProducer producer;  // of the input in forward
};

// What recompute must recreate in place of a dropped tensor: checked on every recompute (as
// torch.utils.checkpoint's default determinism check), so a body that takes another path
// fails naming the tensor instead of handing backward the wrong one.
struct DroppedMeta {
  c10::SmallVector<std::int64_t, 6> sizes;
  at::ScalarType dtype = at::ScalarType::Undefined;
  at::Device device = at::kCPU;
  int region = -1;  // index into Frame::regions; -1 for the checkpoint body outside regions
  // What forward read that takes a gradient, where it came from outside the checkpoint's body (not
  // its inputs, not a cast autocast caches): recompute must read the same kind again. A parameter
  // where forward read a tensor computed before the checkpoint, or the other way round, means weights
  // were swapped in for forward or backward alone (torch.func.functional_call): wrong gradients.
  // `frozen`: a tensor that takes no gradient, not an input (a frozen weight, a buffer, a mask the
  // body makes); recompute reading another the body held, with other values, is a swap too.
  enum class Read : std::uint8_t { other, parameter, computed_before, frozen };
  Read read = Read::other;
  // Where forward read a parameter or a frozen tensor (or a view of one): that tensor, which
  // recompute must read.
  c10::weak_intrusive_ptr<c10::TensorImpl> parameter{c10::intrusive_ptr<c10::TensorImpl>()};
  SavedProducer producer;  // set where forward dropped it

  static DroppedMeta of(const at::Tensor& t, int region);
  bool operator==(const DroppedMeta& other) const {
    return sizes == other.sizes && dtype == other.dtype && device == other.device;
  }
  bool describes(const at::Tensor& t) const {  // as `*this == of(t, region)`, copying nothing
    return t.sizes().equals(sizes) && t.scalar_type() == dtype && t.device() == device;
  }
  std::string describe() const;  // "float32 [32, 64] on cpu"
};

// A tensor from outside the checkpoint (a parameter, a captured weight) that forward saved and
// dropped: recompute reads the same tensor again, so a change in place since forward would
// recreate other values. Recompute refuses to start, as autograd refuses to unpack a saved tensor
// changed since it was saved.
struct DroppedVersion {
  std::size_t index = 0;  // its dropped slot
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  std::uint32_t version_at_save = 0;
  std::uint32_t version_at_forward_end = 0;  // as the body returned (finish_forward)
};

// What verify_recompute compares: an exact hash of the bytes, plus sums that say how large
// a difference is.
struct Fingerprint {
  std::string where;  // "region 'layers.0::mlp'" or "the checkpoint body"
  std::vector<std::int64_t> shape;
  std::uint64_t hash = 0;
  double sum = 0;
  double norm = 0;
};
Fingerprint fingerprint_of(const at::Tensor& t, std::string where);

}  // namespace remat::detail
