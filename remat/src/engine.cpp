// The process's autograd engine while checkpoints are in use, and the saved-tensor hooks it
// supplies: a checkpoint's forward keeps what save regions save and drops the rest, recompute
// recreates the dropped tensors on first unpack in backward and stops early.

#include "engine.hpp"
#include "frame.hpp"
#include "saved_registry.hpp"

#include <remat/saved_report.hpp>

#include <ATen/SavedTensorHooks.h>
#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <mutex>
#include <utility>

namespace remat {
namespace detail {
namespace {



// Hooks the user pushed inside the checkpoint's body, and tracing (which defers hooks to
// runtime), take precedence over the checkpoint's own.
bool user_hooks_win(const ThreadState& state) {
  const auto& hooks = at::SavedTensorDefaultHooks::get_tls_state();
  return hooks.is_tracing || hooks.stack.size() > state.user_hooks_depth;
}


std::atomic<BackwardErrorTranslator> g_backward_error_translator{nullptr};

thread_local SavedTensorsWalk* t_walk = nullptr;  // the walk entered on this thread

// What is wrong with the tensor recompute recreated in place of dropped tensor `index`, if
// anything: another shape, dtype or device always; other values under verify_recompute.
std::optional<std::string> recreated_mismatch(const Frame& frame, std::size_t index, const at::Tensor& recreated,
                                              int region) {
  const DroppedMeta& forward_meta = frame.dropped_metas[index];
  const DroppedMeta now_meta = DroppedMeta::of(recreated, region);
  if (!(now_meta == forward_meta)) {
    return "recompute of checkpoint '" + frame.options.region_name + "' recreated saved tensor #" +
           std::to_string(index) + " as " + now_meta.describe() + " in " + frame.where(region) +
           ", but forward saved " + forward_meta.describe() + " in " + frame.where(forward_meta.region) +
           "; the body must take the same path in recompute as in forward (branch on " + api_name("is_recomputing") +
           "() only for work autograd does not save, and run it under the same autocast and grad modes)";
  }
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
         ". The region is not deterministic: add a " + api_name("RecomputeStateHook") +
         " for the state it depends on (RNG: " + api_name("cpu_rng_state_hook") + "())";
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

  void call_pack_hook(const at::Tensor& tensor) override {
    Frame& f = *frame_;
    if (state_.mode == Mode::recompute) {
      const std::size_t index = f.recompute_packs++;
      const int region = state_.in_region ? static_cast<int>(f.recompute_regions) - 1 : -1;
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
        if (--f.missing == 0 && f.stop_early) throw StopRecompute{};
      }
      frame_.reset();  // the recompute graph is thrown away; nothing to keep
      return;
    }
    f.persist(tensor);  // a save region's output that autograd saves must survive
    if (state_.save_region >= 0) {
      // Kept: as it is, or through the hook pair in force. The hook still holds the frame: what
      // the checkpoint persisted stays resident as long as the graph that may need it.
      for (const auto& [impl, given] : f.pending_names) {
        if (impl == tensor.unsafeGetTensorImpl()) saved_name_ = given;
      }
      // Autograd does not check the version of a tensor saved through hooks: these do, as
      // autograd would, so an in-place change after the save is an error, not a wrong gradient.
      region_index_ = static_cast<int>(f.regions.size()) - 1;
      version_ = tensor.unsafeGetTensorImpl()->version_counter();
      if (version_.enabled()) saved_version_ = version_.current_version();
      if (const std::optional<std::size_t> slot = f.ferry(tensor, state_.save_region)) {
        // Recompute recreates the region's input it views: taken from there, not kept.
        ferried_ = true;
        index_ = *slot;
        f.sequence_at_last_drop = at::sequence_number::peek();
        track(at::Tensor());
        return;
      }
      const at::TensorBase& base = tensor.is_view() ? tensor._base() : static_cast<const at::TensorBase&>(tensor);
      const bool of_parameter = base.is_leaf() && base.requires_grad();
      if (const std::shared_ptr<SavedTensorHooks>& hooks = active_saved_tensor_hooks()) {
        const std::any context = hooks->captures_context() ? hooks->capture_context() : std::any();
        packed_ = PackedTensor(hooks, tensor.detach(), {SavedTensorKind::backward, &context, of_parameter, &f});
        track(at::Tensor());
        return;
      }
      // variable_data(): the same storage without the graph, as detach() gives, but without a
      // dispatcher round trip; the runtime uses it wherever it holds tensors past forward.
      kept_ = tensor.variable_data();
      f.kept.push_back({state_.save_region, saved_name_, of_parameter,
                        c10::weak_intrusive_ptr<c10::TensorImpl>(kept_.getIntrusivePtr())});
      track(kept_);
      return;
    }
    f.note_read(tensor);
    f.dropped_metas.push_back(DroppedMeta::of(tensor, state_.in_region ? static_cast<int>(f.regions.size()) - 1 : -1));
    if (f.options.verify_recompute) {
      f.fingerprints.push_back(fingerprint_of(
          tensor, state_.region != nullptr ? "region '" + f.options.region_name + "::" + *state_.region + "'"
                                           : std::string("the body of checkpoint '") + f.options.region_name + "'"));
    }
    if (f.made_outside(tensor) && tensor.unsafeGetTensorImpl()->version_counter().enabled()) {
      const c10::VariableVersion& version = tensor.unsafeGetTensorImpl()->version_counter();
      f.dropped_versions.push_back({f.dropped, version, version.current_version()});
    }
    index_ = f.dropped++;
    f.sequence_at_last_drop = at::sequence_number::peek();
    track(at::Tensor());
  }

  at::Tensor call_unpack_hook() override {
    const bool kept = kept_.defined() || packed_;
    if (t_walk != nullptr && frame_) {
      t_walk->note_checkpoint(frame_);
      if (!kept) {
        throw Error(std::string(SavedTensorsWalk::kDroppedForRecompute) + " by checkpoint '" +
                    frame_->options.region_name + "'");
      }
    }
    try {
      // Disabled (never checked) for tensors dropped outside save regions: recompute makes them.
      if (version_.enabled() && version_.current_version() != saved_version_) throw modified_in_place();
      if (kept_.defined()) return kept_;
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
    throw StopRecompute{};
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
};

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

// Frames are owned by the hooks of the tensors they dropped; the running one is reachable
// from the thread state as a raw pointer, and from here as a shared pointer for new hooks.
thread_local std::shared_ptr<Frame> t_frame_owner;

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
      return std::make_unique<SavedHooks>(t_frame_owner, state);
    }
    if (saved_tracking_enabled() && user_hooks_depth() == 0) return std::make_unique<TrackingHooks>();
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

// Saved-tensor hooks pushed on PyTorch's stack (Python's saved_tensors_hooks; always 0 in a
// C++ program).
std::size_t user_hooks_depth() { return at::SavedTensorDefaultHooks::get_tls_state().stack.size(); }

void set_backward_error_translator(BackwardErrorTranslator translator) { g_backward_error_translator = translator; }

FrameOwnerScope::FrameOwnerScope(std::shared_ptr<Frame> frame) : previous_(std::exchange(t_frame_owner, std::move(frame))) {}
FrameOwnerScope::~FrameOwnerScope() { t_frame_owner = std::move(previous_); }

void ensure_engine_installed() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_replaced_engine = &torch::autograd::Engine::get_default_engine();
    remat_engine();
    torch::autograd::set_default_engine_stub(&remat_engine);
  });
}

}  // namespace detail

void SavedTensorsWalk::enter() {
  if (entered_) throw Error("saved-tensors walk: entered twice");
  previous_ = std::exchange(detail::t_walk, this);
  entered_ = true;
}

void SavedTensorsWalk::exit() {
  if (!entered_ || detail::t_walk != this) throw Error("saved-tensors walk: exited out of order or on another thread");
  detail::t_walk = std::exchange(previous_, nullptr);
  entered_ = false;
}

SavedTensorsWalk::~SavedTensorsWalk() {
  if (entered_ && detail::t_walk == this) detail::t_walk = previous_;
}

void SavedTensorsWalk::note_checkpoint(const std::shared_ptr<detail::Frame>& frame) {
  for (const auto& seen : checkpoints_) {
    if (seen == frame) return;
  }
  checkpoints_.push_back(frame);
}

}  // namespace remat
