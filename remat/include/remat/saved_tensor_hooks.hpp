#pragma once
// Saved-tensor hooks: a pack/unpack pair that changes how a tensor the checkpoint runtime keeps
// is held (offloaded to host memory, compressed, logged), never which tensors are kept. The
// runtime still decides what a checkpoint keeps; a pair only takes the kept tensor in pack and
// gives it back in unpack.
//
//   auto offload = std::make_shared<MyOffload>();           // a SavedTensorHooks
//   remat::SavedTensorHooksScope scope(offload);             // save regions inside use it
//   auto y = remat::checkpoint({.region_name = "layers.0",
//                               .saved_tensor_hooks = offload})(block)(x);  // inputs too
//
// What goes through a pair (SavedTensorKind): a tensor a save region saves for backward, a save
// region's output kept for recompute, and, for the pair the checkpoint was called under, the
// checkpoint inputs recompute starts from. The innermost pair wins: a scope entered inside a
// checkpoint's body applies to the save regions in it; the checkpoint's own pair to the rest.

#include <ATen/core/Tensor.h>

#include <any>
#include <cstdint>
#include <memory>
#include <string_view>

namespace remat {

enum class SavedTensorKind : std::uint8_t {
  checkpoint_input,  // an input recompute starts from
  backward,          // saved for backward by an op inside a save region
  save_output,       // a save region's output kept because recompute reads it
};

// "CHECKPOINT_INPUT", "BACKWARD", "SAVE_OUTPUT": the names torch_remat gives them.
const char* to_string(SavedTensorKind kind);

class SavedTensorHooks {
 public:
  virtual ~SavedTensorHooks() = default;
  // Runs where the tensor is produced (in the save region, or at checkpoint entry for inputs);
  // what it returns is handed to pack through current_saved_tensor_info().context, also when
  // the pack itself runs later (a save region's output is packed when forward ends).
  virtual std::any capture_context() { return {}; }
  // Whether capture_context does anything: saves a call per pack when it does not.
  virtual bool captures_context() const { return false; }
  // The payload held in place of `tensor` (which pack may copy elsewhere and let go of).
  virtual std::any pack(const at::Tensor& tensor) = 0;
  // The tensor back from its payload: in recompute for inputs and save-region outputs (in
  // forward order), when its autograd node runs for the rest. May run more than once
  // (backward with retain_graph) and on autograd's threads.
  virtual at::Tensor unpack(const std::any& payload) = 0;
};

// Why the pack running on this thread keeps its tensor, and the context captured for it.
struct SavedTensorInfo {
  SavedTensorKind kind = SavedTensorKind::backward;
  const std::any* context = nullptr;  // empty when the pair captures none
  // The tensor is a parameter or a view of one (a leaf that requires grad; packs see it
  // detached): its memory stays with the model whatever the pair does.
  bool of_parameter = false;
  // The checkpoint whose forward keeps the tensor, as an identity that tells the packs of one
  // checkpoint from the next (it may be reused once that checkpoint is gone); null outside.
  const void* checkpoint = nullptr;
  // The region the tensor is kept for when the pack runs outside it (a checkpoint's inputs and
  // save-region outputs are packed as forward ends), as tags name it; empty when the pack runs
  // inside it. Valid during the pack.
  std::string_view region;
};

// The info of the pack running on this thread; throws remat::Error outside a pack.
const SavedTensorInfo& current_saved_tensor_info();

// Save regions entered inside the scope keep their tensors through `hooks`, on this thread
// (a null pair: resident, as without a scope). Scopes ended out of order remove their own
// pair only: the innermost scope still alive decides.
class SavedTensorHooksScope {
 public:
  explicit SavedTensorHooksScope(std::shared_ptr<SavedTensorHooks> hooks);
  ~SavedTensorHooksScope();
  SavedTensorHooksScope(const SavedTensorHooksScope&) = delete;
  SavedTensorHooksScope& operator=(const SavedTensorHooksScope&) = delete;
};

// hooks.pack(tensor) with current_saved_tensor_info() telling `info` inside.
std::any run_pack(SavedTensorHooks& hooks, const at::Tensor& tensor, const SavedTensorInfo& info);

// The pair in force on this thread (innermost scope), or null.
const std::shared_ptr<SavedTensorHooks>& active_saved_tensor_hooks();

// A tensor held through a pair: the pair that packed it and its payload. The pair's pack and
// unpack run with autograd off.
class PackedTensor {
 public:
  PackedTensor() = default;
  // Packs through run_pack.
  PackedTensor(std::shared_ptr<SavedTensorHooks> hooks, const at::Tensor& tensor, const SavedTensorInfo& info);
  explicit operator bool() const { return hooks_ != nullptr; }
  at::Tensor unpack() const;

 private:
  std::shared_ptr<SavedTensorHooks> hooks_;
  std::any payload_;
};

}  // namespace remat
