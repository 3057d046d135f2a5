// The thread's pair of saved-tensor hooks and the info a pack reads.

#include <remat/errors.hpp>
#include <remat/saved_tensor_hooks.hpp>

#include <c10/core/GradMode.h>

#include <iterator>
#include <utility>
#include <vector>

namespace remat {
namespace {

// The scopes alive on this thread with their pairs, innermost last.
thread_local std::vector<std::pair<const SavedTensorHooksScope*, std::shared_ptr<SavedTensorHooks>>> t_scopes;
thread_local const SavedTensorInfo* t_pack_info = nullptr;  // set while a pack runs

// Sets the info for one pack and puts the outer one back (a pack may save tensors itself).
class PackInfoScope {
 public:
  explicit PackInfoScope(const SavedTensorInfo& info) : previous_(std::exchange(t_pack_info, &info)) {}
  ~PackInfoScope() { t_pack_info = previous_; }
  PackInfoScope(const PackInfoScope&) = delete;
  PackInfoScope& operator=(const PackInfoScope&) = delete;

 private:
  const SavedTensorInfo* previous_;
};

}  // namespace

const char* to_string(SavedTensorKind kind) {
  switch (kind) {
    case SavedTensorKind::checkpoint_input: return "CHECKPOINT_INPUT";
    case SavedTensorKind::backward: return "BACKWARD";
    case SavedTensorKind::save_output: return "SAVE_OUTPUT";
  }
  return "BACKWARD";
}

const SavedTensorInfo& current_saved_tensor_info() {
  if (t_pack_info == nullptr) {
    throw Error(detail::api_name("current_saved_tensor_info") +
                "() may only be called from a remat saved-tensor pack hook (it tells why the tensor being packed is "
                "kept)");
  }
  return *t_pack_info;
}

SavedTensorHooksScope::SavedTensorHooksScope(std::shared_ptr<SavedTensorHooks> hooks) {
  t_scopes.emplace_back(this, std::move(hooks));
}

SavedTensorHooksScope::~SavedTensorHooksScope() {
  for (auto scope = t_scopes.rbegin(); scope != t_scopes.rend(); ++scope) {
    if (scope->first == this) {
      t_scopes.erase(std::next(scope).base());
      return;
    }
  }
}

const std::shared_ptr<SavedTensorHooks>& active_saved_tensor_hooks() {
  static const std::shared_ptr<SavedTensorHooks> none;
  return t_scopes.empty() ? none : t_scopes.back().second;
}

std::any run_pack(SavedTensorHooks& hooks, const at::Tensor& tensor, const SavedTensorInfo& info) {
  PackInfoScope scope(info);
  return hooks.pack(tensor);
}

namespace {

// A pair's ops run without autograd: inside a checkpoint they would otherwise save tensors the
// runtime counts as the body's, which recompute (where packs do not run) would not save again.
std::any pack_without_grad(SavedTensorHooks& hooks, const at::Tensor& tensor, const SavedTensorInfo& info) {
  c10::NoGradGuard no_grad;
  return run_pack(hooks, tensor, info);
}

}  // namespace

PackedTensor::PackedTensor(std::shared_ptr<SavedTensorHooks> hooks, const at::Tensor& tensor,
                           const SavedTensorInfo& info)
    : hooks_(std::move(hooks)), payload_(pack_without_grad(*hooks_, tensor, info)) {}

at::Tensor PackedTensor::unpack() const {
  c10::NoGradGuard no_grad;
  at::Tensor tensor = hooks_->unpack(payload_);
  if (!tensor.defined()) {
    throw Error("a saved-tensor unpack hook returned no tensor; unpack must return the tensor its pack was given "
                "(or an equal copy)");
  }
  return tensor;
}

}  // namespace remat
