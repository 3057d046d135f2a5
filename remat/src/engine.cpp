// The process's autograd engine while checkpoints are in use: it hands out the saved-tensor
// hooks of the checkpoint running on this thread (checkpoint_hooks.hpp), or of saved-tensor
// tracking, and leaves everything else to the engine it replaced.

#include "engine.hpp"

#include "checkpoint_hooks.hpp"
#include "saved_registry.hpp"
#include "thread_state.hpp"

#include <remat/alloc/allocator.hpp>

#include <ATen/SavedTensorHooks.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace remat {
namespace detail {
namespace {

// Hooks the user pushed inside the checkpoint's body, and tracing (which defers hooks to
// runtime), take precedence over the checkpoint's own.
bool user_hooks_win(const ThreadState& state) {
  const auto& hooks = at::SavedTensorDefaultHooks::get_tls_state();
  return hooks.is_tracing || hooks.stack.size() > state.user_hooks_depth;
}

// Saved-tensor hooks deferred to runtime (tracing) or switched off (where PyTorch refuses them).
bool tracing_or_disabled() {
  return at::SavedTensorDefaultHooks::get_tls_state().is_tracing || !at::SavedTensorDefaultHooks::is_enabled();
}

// Outside checkpoints, under SavedTensorsTracking: keeps the tensor as autograd would and
// records which node saved it.
class TrackingHooks final : public torch::autograd::SavedVariableHooks {
 public:
  TrackingHooks() = default;
  ~TrackingHooks() override { unregister_saved(this); }
  TrackingHooks(const TrackingHooks&) = delete;
  TrackingHooks& operator=(const TrackingHooks&) = delete;

  void call_pack_hook(const at::Tensor& tensor) override {
    tensor_ = tensor;
    SavedEntry entry = entry_for_current_node();
    entry.tensor = tensor;
    register_saved(this, std::move(entry));
  }
  at::Tensor call_unpack_hook() override { return tensor_; }

 private:
  at::Tensor tensor_;
};

// Inside a tracked model's forward, outside checkpoints (remat_alloc.track), or anywhere outside
// them while a tracking is active (a loss computed after the model): keeps the tensor as autograd
// would and names its storage an activation of the module that made it, where it is still unnamed
// or a temporary. A parameter (a leaf that requires grad, or a view of one) is no
// activation: one tracking does not know (added or replaced after track) keeps its tag.
class ActivationHooks final : public torch::autograd::SavedVariableHooks {
 public:
  ActivationHooks() : outside_model_(tracked_forwards() == 0) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    try {
      const at::TensorBase& base = tensor.is_view() ? tensor._base() : static_cast<const at::TensorBase&>(tensor);
      const bool of_parameter = base.is_leaf() && base.requires_grad();
      if (!of_parameter && tensor.has_storage()) alloc::name_as_activation(tensor.storage().data());
    } catch (const c10::Error&) {  // a tensor subclass without accessible storage: left as it is
    }
    // Held without its graph: a tensor saved as its own node's output would hold that node, and
    // the node these hooks, a cycle nothing frees.
    tensor_ = tensor.variable_data();  // detach() without a dispatcher round trip
    version_ = tensor.unsafeGetTensorImpl()->version_counter();
    if (version_.enabled()) saved_version_ = version_.current_version();
  }
  // Compiled autograd asks for a Python unpack hook to trace; there is none.
  std::optional<std::pair<c10::SafePyObject, c10::SafePyObject>> retrieve_unpack_hook_data() const override {
    refuse_tracking_under_compiled_autograd();
  }

  // Autograd checks no version of a tensor saved through hooks: these do, as autograd would
  // without them, so an in-place change after the save is an error, not a wrong gradient.
  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(!version_.enabled() || version_.current_version() == saved_version_,
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                "a tensor saved for backward in a tracked forward (remat_alloc.track) is at version ",
                version_.current_version(), "; expected version ", saved_version_,
                " instead. Clone it before changing it in place, or change a copy.");
    // Saved outside the model (a loss after it): its backward runs before backward reaches the
    // model's modules, so what it allocates is a temporary of "(backward)" from here.
    if (outside_model_ && torch::autograd::get_current_graph_task_id() >= 0) {
      static const alloc::NameId backward = alloc::intern_name("(backward)");
      restore_category_when_backward_ends();
      alloc::set_category_by_id(alloc::Category::temporary, backward);
    }
    return tensor_;
  }

 private:
  bool outside_model_;
  at::Tensor tensor_;
  c10::VariableVersion version_{c10::VariableVersion::DISABLED};
  std::uint32_t saved_version_ = 0;
};

std::atomic<int> g_active_trackings{0};

bool tracking_active() { return g_active_trackings.load(std::memory_order_relaxed) > 0; }

// The backwards (graph tasks) on this thread whose end puts back the category in force where they
// first named one; a few, each forgotten at its end (one ended on another thread is dropped when
// the list is full).
thread_local std::vector<int> t_restoring;

// The process's autograd engine while checkpoints are in use: it supplies the saved-tensor
// hooks of checkpoints and of saved-tensor tracking, and hands everything else to the engine
// it replaced (LibTorch's own in a C++ program). Backward runs on that engine: LibTorch
// starts device threads for one engine per process only, so a second engine could not run
// backward on CUDA tensors.
class RematEngine final : public torch::autograd::Engine {
 public:
  explicit RematEngine(torch::autograd::Engine& delegate) : delegate_(delegate) {}

  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    const ThreadState& state = thread_state();
    if (state.frame != nullptr && state.mode != Mode::none && !user_hooks_win(state)) {
      return make_checkpoint_hooks(frame_owner(), state);
    }
    if (saved_tracking_enabled() && user_hooks_depth() == 0) return std::make_unique<TrackingHooks>();
    if ((tracked_forwards() > 0 || tracking_active()) && user_hooks_depth() == 0 && !tracing_or_disabled()) {
      return std::make_unique<ActivationHooks>();
    }
    return delegate_.get_default_saved_variable_hooks();
  }

  torch::autograd::variable_list execute(const torch::autograd::edge_list& roots,
                                         const torch::autograd::variable_list& inputs, bool keep_graph,
                                         bool create_graph, bool accumulate_grad,
                                         const torch::autograd::edge_list& outputs) override {
    return delegate_.execute(roots, inputs, keep_graph, create_graph, accumulate_grad, outputs);
  }

  c10::intrusive_ptr<at::ivalue::Future> execute_with_graph_task(
      const std::shared_ptr<torch::autograd::GraphTask>& graph_task, std::shared_ptr<torch::autograd::Node> graph_root,
      torch::autograd::InputBuffer&& input_buffer) override {
    return delegate_.execute_with_graph_task(graph_task, std::move(graph_root), std::move(input_buffer));
  }

  std::unique_ptr<torch::autograd::AnomalyMetadata> make_anomaly_metadata() override {
    return delegate_.make_anomaly_metadata();
  }

  void thread_on_exception(const std::shared_ptr<torch::autograd::GraphTask>& graph_task,
                           const std::shared_ptr<torch::autograd::Node>& fn, std::exception& e) override {
    delegate_.thread_on_exception(graph_task, fn, e);
  }

  void thread_init(int device, const std::shared_ptr<torch::autograd::ReadyQueue>& ready_queue,
                   bool should_increment) override {
    delegate_.thread_init(device, ready_queue, should_increment);
  }

 private:
  torch::autograd::Engine& delegate_;
};

torch::autograd::Engine* g_replaced_engine = nullptr;  // set once, before the stub points here

torch::autograd::Engine& remat_engine() {
  static auto* engine = new RematEngine(*g_replaced_engine);  // lives as long as the process
  return *engine;
}

}  // namespace

void ensure_engine_installed() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_replaced_engine = &torch::autograd::Engine::get_default_engine();
    remat_engine();
    torch::autograd::set_default_engine_stub(&remat_engine);
  });
}

void restore_category_when_backward_ends() {
  const int task = torch::autograd::get_current_graph_task_id();
  if (task < 0 || std::find(t_restoring.begin(), t_restoring.end(), task) != t_restoring.end()) return;
  if (t_restoring.size() >= 16) t_restoring.erase(t_restoring.begin());
  t_restoring.push_back(task);
  torch::autograd::Engine::get_default_engine().queue_callback([before = alloc::current_category_id(), task] {
    alloc::set_category_by_id(before.first, before.second);
    std::erase(t_restoring, task);
  });
}

void refuse_tracking_under_compiled_autograd() {
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "remat_alloc.track does not work under compiled autograd "
                              "(torch._dynamo.compiled_autograd, or torch._dynamo.config.compiled_autograd = True): "
                              "its backward hooks run in C++, which compiled autograd cannot trace. Run the tracked "
                              "step with compiled autograd off, or untrack the model for compiled-autograd steps");
}

void count_active_trackings(int change) {
  if (change > 0) ensure_engine_installed();
  g_active_trackings.fetch_add(change, std::memory_order_relaxed);
}

}  // namespace detail

}  // namespace remat
