#pragma once
// Activation checkpointing for LibTorch with save and recompute regions.
//
//   auto y = remat::checkpoint({.region_name = "layers.0"})([&](const at::Tensor& x) {
//     auto h = remat::region(attention, "attention", /*recompute=*/false)(x);  // saved
//     return remat::region(mlp, "mlp")(h);                                      // recomputed
//   })(x);
//
// Forward keeps only what backward needs from save regions; everything else is recomputed
// when backward first needs it, and recompute stops as soon as every needed tensor exists.
// During recompute a save region's body is skipped: it returns its persisted output, or a
// placeholder with the right shape, strides and dtype whose data cannot be read.

#include <remat/budget/plan.hpp>
#include <remat/cpu_allocator.hpp>
#include <remat/context.hpp>
#include <remat/errors.hpp>
#include <remat/saved_tensor_hooks.hpp>
#include <remat/state_hooks.hpp>

#include <ATen/core/Tensor.h>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace remat {

// What a caller keeps with one checkpoint call and reads back while that call's body runs
// (checkpoint_caller()); the runtime only holds it, as long as the call's recompute may run.
// The Python package keeps there what its budget plan or profile knows of the call.
struct CheckpointCaller {
  virtual ~CheckpointCaller() = default;
};

struct CheckpointOptions {
  std::string region_name = "checkpoint";
  std::vector<std::shared_ptr<RecomputeStateHook>> recompute_state_hooks;
  // Not supported: RNG state belongs in a RecomputeStateHook (cpu_rng_state_hook()).
  // Setting it to true is an error that says so.
  std::optional<bool> preserve_rng_state;
  // One context per checkpoint call from each factory, entered around forward and around
  // every recompute (e.g. RecomputeReplay::context_factory()).
  std::vector<CheckpointContextFactory> contexts;
  // Checksums every tensor recompute recreates against forward and raises an error naming
  // the region, the tensor's position and the size of the difference on a mismatch.
  bool verify_recompute = false;
  // Holds what the checkpoint keeps through this pair: the inputs recompute starts from and,
  // unless a pair is entered inside the body, what its save regions keep. Null: the pair in
  // force where the checkpoint is called (SavedTensorHooksScope), if any.
  std::shared_ptr<SavedTensorHooks> saved_tensor_hooks;
  // Save or recompute by region from a budget plan (remat::budget::solve, or a remat-plan dump
  // read with plan_from_json): a region the plan names, as "checkpoint::region" or a pattern,
  // takes the plan's choice over its own recompute setting; the others keep theirs. Inside a
  // region the plan saves, inner regions run as part of it. Null: every region its own setting.
  // A plan may recompute a region the code saves, so under one the runtime keeps the CPU
  // generator's state as cpu_rng_state_hook() does (dropout draws forward's mask again), and the
  // default generator of every CUDA device that has a context when the checkpoint starts,
  // through LibTorch's device-generic hooks (no remat::cuda needed; nothing where CUDA is absent).
  // Under one, a save region that changed its input in place, or whose output was changed in
  // place after it returned, runs again in recompute rather than being skipped (without a plan
  // it is an error): MemoryReport::rerun_regions lists those. A per-op plan's region that
  // recomputes keeping ops (budget::solve_ops) holds those ops' outputs from forward, and its
  // recompute takes them instead of running the ops again (remat/kept_ops.hpp): its ops must be
  // the ones the plan names, in forward and in recompute, else c10::ValueError names the first
  // difference; a region that records a replay decision keeps none (refused the same way).
  std::shared_ptr<const budget::RegionChoices> plan;
  // Handed back by checkpoint_caller() while the body runs. Null: none.
  std::shared_ptr<CheckpointCaller> caller;
};

using TensorList = std::vector<at::Tensor>;
using FlatFunction = std::function<TensorList(const TensorList&)>;

namespace detail {

TensorList run_checkpoint(const CheckpointOptions& options, FlatFunction body, TensorList inputs);
// Called with an Error the runtime raises in backward (recompute, reached from autograd's
// unpack of a saved tensor), before it propagates into the autograd engine; it may throw
// another exception in its place (the Python extension throws one that PyTorch's engine
// re-raises as remat.RematError). Null: the Error propagates as it is.
using BackwardErrorTranslator = void (*)(const Error& error);
void set_backward_error_translator(BackwardErrorTranslator translator);
// Called where recompute stops early (every tensor backward needs exists); it throws what
// unwinds the rest of the body. The Python extension throws one that reaches Python as
// remat.RecomputeStopped, a BaseException, so that the body's `except Exception:` (a kernel
// fallback) lets it pass. Null: detail::StopRecompute, a std::exception.
using RecomputeStopRaiser = void (*)();
void set_recompute_stop_raiser(RecomputeStopRaiser raiser);

// `annotation`, when given, is kept with a save region's record in forward and handed back in
// recompute, where the body is skipped (the Python binding keeps its result's structure there).
TensorList run_region(FlatFunction body, const std::string& name, bool recompute, TensorList inputs,
                      std::shared_ptr<void>* annotation = nullptr);

// Inputs and outputs: a tensor, or one level of tuple or vector of tensors.
template <typename T>
struct Flat {
  static_assert(sizeof(T) == 0,
                "remat: checkpoint and region inputs and outputs must be at::Tensor, std::tuple<at::Tensor...> "
                "or std::vector<at::Tensor> (one level deep)");
};

template <>
struct Flat<at::Tensor> {
  static void append(const at::Tensor& t, TensorList& out) { out.push_back(t); }
  static std::size_t count(const at::Tensor&) { return 1; }
  static at::Tensor take(const TensorList& flat, std::size_t& pos, std::size_t) { return flat.at(pos++); }
};

template <>
struct Flat<std::vector<at::Tensor>> {
  static void append(const std::vector<at::Tensor>& v, TensorList& out) { out.insert(out.end(), v.begin(), v.end()); }
  static std::size_t count(const std::vector<at::Tensor>& v) { return v.size(); }
  static std::vector<at::Tensor> take(const TensorList& flat, std::size_t& pos, std::size_t n) {
    std::vector<at::Tensor> out(flat.begin() + static_cast<std::ptrdiff_t>(pos),
                                flat.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
    return out;
  }
};

template <typename... Ts>
struct Flat<std::tuple<Ts...>> {
  static_assert((std::is_same_v<std::decay_t<Ts>, at::Tensor> && ...),
                "remat: a tuple input or output must hold tensors only (one level deep)");
  static void append(const std::tuple<Ts...>& t, TensorList& out) {
    std::apply([&](const auto&... e) { (out.push_back(e), ...); }, t);
  }
  static std::size_t count(const std::tuple<Ts...>&) { return sizeof...(Ts); }
  static std::tuple<Ts...> take(const TensorList& flat, std::size_t& pos, std::size_t) {
    return take_each(flat, pos, std::index_sequence_for<Ts...>{});
  }
  template <std::size_t... I>
  static std::tuple<Ts...> take_each(const TensorList& flat, std::size_t& pos, std::index_sequence<I...>) {
    const std::size_t base = pos;
    pos += sizeof...(Ts);
    return std::tuple<Ts...>(flat.at(base + I)...);
  }
};

template <typename T>
using FlatOf = Flat<std::decay_t<T>>;

// Rebuilds the arguments of a call from the flattened inputs: argument I starts at
// starts[I] and has counts[I] tensors.
template <typename... Args, std::size_t... I>
std::tuple<std::decay_t<Args>...> rebuild_args(const TensorList& in, const std::array<std::size_t, sizeof...(Args)>& starts,
                                               const std::array<std::size_t, sizeof...(Args)>& counts,
                                               std::index_sequence<I...>) {
  return {[&] {
    std::size_t pos = starts[I];
    return FlatOf<Args>::take(in, pos, counts[I]);
  }()...};
}

// Wraps `fn(args...)` as a function of the flattened inputs, rebuilding each argument with
// the element counts of the call.
template <typename F, typename... Args>
std::pair<FlatFunction, TensorList> flatten_call(F fn, const Args&... args) {
  TensorList flat;
  (FlatOf<Args>::append(args, flat), ...);
  const std::array<std::size_t, sizeof...(Args)> counts{FlatOf<Args>::count(args)...};
  std::array<std::size_t, sizeof...(Args)> starts{};
  for (std::size_t i = 1; i < counts.size(); ++i) starts[i] = starts[i - 1] + counts[i - 1];
  FlatFunction body = [fn = std::move(fn), counts, starts](const TensorList& in) -> TensorList {
    auto result = std::apply(fn, rebuild_args<Args...>(in, starts, counts, std::index_sequence_for<Args...>{}));
    TensorList out;
    FlatOf<decltype(result)>::append(result, out);
    return out;
  };
  return {std::move(body), std::move(flat)};
}

template <typename R>
R unflatten_result(const TensorList& flat) {
  std::size_t pos = 0;
  return FlatOf<R>::take(flat, pos, flat.size());
}

}  // namespace detail

template <typename F>
class Checkpointed {
 public:
  Checkpointed(CheckpointOptions options, F fn) : options_(std::move(options)), fn_(std::move(fn)) {}

  template <typename... Args>
  auto operator()(const Args&... args) const {
    using Result = std::decay_t<std::invoke_result_t<const F&, const Args&...>>;
    auto [body, inputs] = detail::flatten_call(fn_, args...);
    return detail::unflatten_result<Result>(detail::run_checkpoint(options_, std::move(body), std::move(inputs)));
  }

 private:
  CheckpointOptions options_;
  F fn_;
};

class CheckpointBuilder {
 public:
  explicit CheckpointBuilder(CheckpointOptions options) : options_(std::move(options)) {}
  template <typename F>
  Checkpointed<std::decay_t<F>> operator()(F&& fn) const {
    return Checkpointed<std::decay_t<F>>(options_, std::forward<F>(fn));
  }

 private:
  CheckpointOptions options_;
};

// checkpoint(options)(fn)(args...): runs fn keeping only what backward needs. A copy of fn
// runs again in backward, on autograd's device thread for CUDA tensors: capture by value, or
// by reference only what outlives backward (not the locals of a function that has returned).
inline CheckpointBuilder checkpoint(CheckpointOptions options = {}) { return CheckpointBuilder(std::move(options)); }

template <typename F>
class Region {
 public:
  Region(F fn, std::string name, bool recompute) : fn_(std::move(fn)), name_(std::move(name)), recompute_(recompute) {}

  template <typename... Args>
  auto operator()(const Args&... args) const {
    using Result = std::decay_t<std::invoke_result_t<const F&, const Args&...>>;
    auto [body, inputs] = detail::flatten_call(fn_, args...);
    return detail::unflatten_result<Result>(detail::run_region(std::move(body), name_, recompute_, std::move(inputs)));
  }

 private:
  F fn_;
  std::string name_;
  bool recompute_;
};

// A region inside a checkpoint. recompute=false makes a save region: autograd keeps what it
// saves, and recompute skips its body. Outside a checkpoint the body simply runs.
template <typename F>
Region<std::decay_t<F>> region(F&& fn, std::string name, bool recompute = true) {
  return Region<std::decay_t<F>>(std::forward<F>(fn), std::move(name), recompute);
}

// Persists `t` (or the save-region output it is a view of) so recompute gets its value
// instead of a placeholder. A no-op outside a checkpoint forward or on a tensor that is not
// a save region's output.
void recompute_needs_tensor(const at::Tensor& t);

// True while recompute replays a checkpoint's forward.
bool is_recomputing();

// Called by a body as it begins: at the start of a recompute's run of a checkpoint's own body
// (once per recompute; elsewhere `tensors` is not called), notes what `tensors()` gives, the
// tensors the body's function holds outside its arguments (its modules' parameters and buffers) as
// they stand. One that recompute reads existed before recompute began, so the body did not make
// it: where forward read another in its place, weights were swapped between forward and recompute.
void note_tensors_held_by_the_body(const std::function<TensorList()>& tensors);

// Where a module holds a buffer (the attribute a body reads it from): the runtime reads what it
// holds and makes it hold another tensor, for a body that assigns the buffer anew in forward
// (`self.memory = 0.9 * self.memory + ...`) rather than changing it in place. Called on any thread.
class BufferSlot {
 public:
  virtual ~BufferSlot() = default;
  // What it holds: nothing where the module has no such buffer, an undefined tensor for None.
  virtual std::optional<at::Tensor> held() const = 0;
  // Makes it hold `value` (as held() gives it: nothing takes the buffer out of the module).
  virtual void hold(const std::optional<at::Tensor>& value) = 0;
};

// A buffer a body's function holds (a module's, outside the body's arguments): `training` is its
// module's mode, `name` its attribute name (for messages). `changes_with`, where defined: forward
// changes this buffer without moving its version counter, as it moves that tensor's (batch norm's
// running statistics while it trains, with its num_batches_tracked). `slot`, where set: where the
// module holds it. `parameter`: a module's parameter rather than a buffer (a body may change one in
// place in forward under no_grad: a momentum encoder's weights), not copied as forward begins before
// a forward has been seen changing it.
struct HeldBuffer {
  at::Tensor tensor;
  bool training = false;
  std::string name;
  at::Tensor changes_with;
  std::shared_ptr<BufferSlot> slot;
  bool parameter = false;
};

// Called by a body as it begins: at the start of a checkpoint's own body in forward (with
// gradients on; elsewhere `buffers` is not called), notes what `buffers()` gives. A buffer the
// body changes in place in forward (a step counter, an exponential average, batch norm's running
// statistics) is given back to each recompute as forward read it, and after recompute as it was
// found: recompute makes what forward made, and the buffer changes once, as without checkpointing.
// So is one the body assigns anew (its slot holds another tensor when forward ends): recompute
// runs with the slot holding the tensor forward read, and the slot holds what it held before after.
// Which buffers a body changes is learned as forward ends: one not seen yet, or seen changed
// before, is copied as forward begins; one seen unchanged in its module's mode is not, and should a
// later forward change it, that call's recompute reads the changed value (a warning says so). A
// parameter is taken as unchanged until a forward changes it (said as for such a buffer); from the
// next call on it is given back to recompute as a buffer is.
void note_buffers_held_by_the_body(const std::function<std::vector<HeldBuffer>()>& buffers);

// Whether `t` shares its storage with a buffer that the checkpoint whose forward runs on this
// thread copied as forward began (note_buffers_held_by_the_body): changed in forward, it is given
// back to recompute as forward read it, so recompute does not change it twice.
bool given_back_to_recompute(const at::Tensor& t);

// Whether `t` is (a view of) a placeholder: what recompute hands back for a skipped save
// region's output that forward did not keep. Its shape, strides and dtype are real; its data
// cannot be read.
bool is_placeholder(const at::Tensor& t);

// True while a checkpoint's forward or recompute runs on this thread.
bool in_checkpoint();

// The CheckpointOptions::caller of the checkpoint whose body runs on this thread: in forward
// (with grad or without, where no recompute will follow) or in a recompute. Null outside a
// body, or when the call gave none.
CheckpointCaller* checkpoint_caller();

}  // namespace remat
