// Ops kept inside recomputed regions (kept_ops.hpp): the dispatcher fallback that numbers a
// region's ops, holds the kept ones' outputs in forward and hands them back in recompute.

#include <remat/errors.hpp>
#include <remat/kept_ops.hpp>

#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_set>

namespace remat {
namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::Fake;

thread_local KeptOps::Scope* innermost = nullptr;  // the scope open last on this thread
thread_local bool included_here = false;           // the key is in this thread's set by its scopes
thread_local int set_aside = 0;                    // set_kept_ops_aside(true) calls not yet undone

// The KeptOps holding outputs now, for held_op_outputs(); their held_ maps change under the lock.
std::mutex holding_mutex;
std::unordered_set<const KeptOps*>& holding() {
  static auto* set = new std::unordered_set<const KeptOps*>();
  return *set;
}

// Runs `op` on the kernels below the fallback's key.
void run_below(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  static const c10::DispatchKeySet below(c10::DispatchKeySet::FULL_AFTER, kKey);
  op.redispatchBoxed(keys & below, stack);
}

// Whether the op is traced rather than run: under one of PyTorch's tracing modes (fake tensors,
// make_fx's proxies, functionalization: torch.compile compiling a function the region calls), or
// on a fake or meta tensor, or making one. A TorchDispatchMode is set aside while torch.compile traces, so the
// profile never numbers these; the compiled code's own ops, when it runs, are numbered.
bool traced(c10::ArrayRef<c10::IValue> arguments) {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  if (TorchDispatchModeTLS::any_modes_set(/*skip_infra_modes=*/false) &&
      (TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE) ||
       TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY) ||
       TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FUNCTIONAL))) {
    return true;
  }
  return std::any_of(arguments.begin(), arguments.end(), [](const c10::IValue& value) {
    if (value.isDevice()) return value.toDevice().is_meta();
    if (!value.isTensor()) return false;
    const c10::Storage& storage = value.toTensor().unsafeGetTensorImpl()->unsafe_storage();
    return storage && storage.device_type() == c10::DeviceType::Meta;
  });
}

// Every op dispatched below autograd while a scope is open on the thread. Ops the kernels run
// inside it are not seen (the key is excluded while it runs), as a TorchDispatchMode does not see
// them.
void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard not_again(kKey);
  // Without a scope the thread took the key from another's state.
  if (innermost == nullptr || set_aside > 0 || traced(torch::jit::last(*stack, op.schema().arguments().size()))) {
    run_below(op, keys, stack);
    return;
  }
  innermost->pass(op, keys, stack);
}

void register_fallback() {
  static const bool registered = [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    if (dispatcher.hasBackendFallbackForDispatchKey(kKey)) {
      throw Error(
          "per-op plans keep ops through a dispatcher fallback on DispatchKey::Fake, and another library "
          "(torchdistx's fake tensors, or a second copy of remat's runtime) registered one there first: "
          "load one of them per process, or plan without kept ops");
    }
    // Lives as long as the process: the dispatcher may outlive every static here.
    new c10::RegistrationHandleRAII(dispatcher.registerFallback(
        kKey, c10::KernelFunction::makeFromBoxedFunction<&fallback>(), "remat: ops kept inside recomputed regions"));
    return true;
  }();
  (void)registered;
}

std::string op_name(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// Whether the op takes an index among the region's ops: not a view (an op that writes nothing
// and returns aliases of its inputs, which the runtime's saved-tensor hooks run differently in a
// saved region and a recomputed one), and not a dtype or device copy (aten::_to_copy, which
// autocast runs for a weight in the first region that casts it and takes from its cache after).
// The profile numbers ops by the same rule (remat/_op_figures.py).
bool numbered(const c10::OperatorHandle& op) {
  static const c10::OperatorHandle to_copy = c10::Dispatcher::singleton().findSchemaOrThrow("aten::_to_copy", "");
  if (op == to_copy) return false;
  const c10::FunctionSchema& schema = op.schema();
  const auto& returns = schema.returns();
  const bool view =
      !schema.is_mutable() && !returns.empty() &&
      std::all_of(returns.begin(), returns.end(), [](const auto& r) { return r.alias_info() != nullptr; });
  return !view;
}

// Whether a plan may keep the op's outputs: functional, not random, outputs not views, of a size
// that does not depend on the values.
bool keepable(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  const auto& returns = schema.returns();
  return !schema.is_mutable() && !returns.empty() &&
         std::none_of(returns.begin(), returns.end(), [](const auto& r) { return r.alias_info() != nullptr; }) &&
         !op.hasTag(at::Tag::nondeterministic_seeded) && !op.hasTag(at::Tag::dynamic_output_shape);
}

std::string profile_again(const std::string& region) {
  return "; the plan was made for other code in region '" + region +
         "', or the region took another path on this step's data (a per-op plan holds only where the region runs "
         "the same ops at every step): profile the model again (remat.profile_regions(ops=True)) and plan from that "
         "profile, or plan such a region without kept ops (profile.plan() without ops=True)";
}

template <typename Fn>
void for_each_tensor(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    fn(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector()) fn(t);
  }
}

// Whether every return is a tensor, a list of tensors or None.
bool plain_returns(c10::ArrayRef<c10::IValue> returns) {
  return std::all_of(returns.begin(), returns.end(),
                     [](const c10::IValue& v) { return v.isTensor() || v.isTensorList() || v.isNone(); });
}

std::uint32_t version_of(const at::Tensor& t) {
  if (!t.defined() || t.is_inference()) return 0;
  return static_cast<std::uint32_t>(t._version());
}

// Calls `fn` on each tensor among an op's arguments, those in lists included (cat's inputs,
// index's Tensor?[], where a None keeps its place as an undefined tensor).
template <typename Fn>
void for_each_tensor_argument(c10::ArrayRef<c10::IValue> arguments, Fn&& fn) {
  for (const c10::IValue& value : arguments) {
    if (value.isTensor() && value.toTensor().defined()) {
      fn(value.toTensor());
    } else if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) {
        if (element.isTensor() || element.isNone()) fn(element.isTensor() ? element.toTensor() : at::Tensor());
      }
    }
  }
}

// The shapes and dtypes of an op's tensor arguments (a None as an empty shape of dtype Undefined).
KeptOps::Shapes input_shapes(c10::ArrayRef<c10::IValue> arguments) {
  KeptOps::Shapes shapes;
  for_each_tensor_argument(arguments, [&](const at::Tensor& t) {
    if (t.defined()) {
      shapes.emplace_back(t.sizes().vec(), t.scalar_type());
    } else {
      shapes.emplace_back(std::vector<std::int64_t>{}, c10::ScalarType::Undefined);
    }
  });
  return shapes;
}

// Per tensor argument, the tensor and storage of a leaf that takes gradients (a weight trained),
// else nulls: forward and recompute read the same ones where they run the same op (the same
// tensor, its storage swapped between them as a sharded parameter's is; or the same storage
// under another tensor, as a checkpoint's input in recompute).
std::vector<KeptOps::TrainedInput> trained_inputs(c10::ArrayRef<c10::IValue> arguments) {
  std::vector<KeptOps::TrainedInput> trained;
  for_each_tensor_argument(arguments, [&](const at::Tensor& t) {
    const bool leaf = t.defined() && t.requires_grad() && t.is_leaf() && t.has_storage();
    trained.push_back(leaf ? KeptOps::TrainedInput{t.unsafeGetTensorImpl(), t.storage().unsafeGetStorageImpl()}
                           : KeptOps::TrainedInput{});
  });
  return trained;
}

std::string describe(const KeptOps::Shapes& shapes) {
  if (shapes.empty()) return "none";
  std::ostringstream out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    out << (i ? ", " : "") << '[';
    for (std::size_t d = 0; d < shapes[i].first.size(); ++d) out << (d ? ", " : "") << shapes[i].first[d];
    out << "] "
        << (shapes[i].second == c10::ScalarType::Undefined ? "None" : c10::getDtypeNames(shapes[i].second).first);
  }
  return out.str();
}

// A return handed back in recompute: a new tensor over each held one's storage, which autograd
// above makes the recomputed op's output without touching forward's.
c10::IValue fresh(const c10::IValue& value) {
  const auto detached = [](const at::Tensor& t) { return t.defined() ? t.detach() : t; };
  if (value.isTensor()) return detached(value.toTensor());
  if (!value.isTensorList()) return value;
  std::vector<at::Tensor> tensors = value.toTensorVector();
  for (at::Tensor& t : tensors) t = detached(t);
  return tensors;
}

}  // namespace

KeptOps::KeptOps(std::string region, std::map<std::uint32_t, std::string> kept)
    : region_(std::move(region)), kept_(std::move(kept)) {
  if (kept_.empty()) throw Error("KeptOps for region '" + region_ + "' names no op to keep: run the region plainly");
  last_ = kept_.rbegin()->first;
  register_fallback();
}

KeptOps::~KeptOps() { clear(); }

void KeptOps::clear() {
  std::map<std::uint32_t, Held> dropped;  // let go after the lock: freeing a tensor may take Python's GIL
  std::lock_guard<std::mutex> lock(holding_mutex);
  dropped.swap(held_);
  holding().erase(this);
}

void set_kept_ops_aside(bool aside) { set_aside = std::max(0, set_aside + (aside ? 1 : -1)); }

std::vector<HeldOpOutput> held_op_outputs() {
  std::vector<HeldOpOutput> outputs;
  std::unordered_set<const c10::StorageImpl*> seen;
  std::lock_guard<std::mutex> lock(holding_mutex);
  for (const KeptOps* ops : holding()) {
    for (const auto& [index, held] : ops->held_) {
      for (const c10::IValue& value : held.returns) {
        for_each_tensor(value, [&](const at::Tensor& t) {
          if (!t.defined() || !t.has_storage() || !seen.insert(t.storage().unsafeGetStorageImpl()).second) return;
          outputs.push_back({t.device().str(), reinterpret_cast<std::uintptr_t>(t.storage().data()),
                             static_cast<std::uint64_t>(t.storage().nbytes())});
        });
      }
    }
  }
  return outputs;
}

KeptOps::Scope::Scope(KeptOps& ops, bool recomputing) : ops_(ops), recomputing_(recomputing), outer_(innermost) {
  if (!recomputing_) {
    ops_.clear();
    ops_.ran_.clear();
  }
  if (innermost == nullptr && !c10::impl::tls_is_dispatch_key_included(kKey)) {
    c10::impl::tls_set_dispatch_key_included(kKey, true);
    included_here = true;
  }
  innermost = this;
}

KeptOps::Scope::~Scope() {
  if (!open_) return;  // finished
  close();
  ops_.clear();
}

void KeptOps::Scope::close() {
  // Scopes close in the order they opened on a thread; one that did not is taken out of the chain,
  // and the key stays in the thread's set while any is open.
  if (innermost == this) {
    innermost = outer_;
  } else {
    for (Scope* scope = innermost; scope != nullptr; scope = scope->outer_) {
      if (scope->outer_ == this) {
        scope->outer_ = outer_;
        break;
      }
    }
  }
  open_ = false;
  if (innermost == nullptr && included_here) {
    c10::impl::tls_set_dispatch_key_included(kKey, false);
    included_here = false;
  }
}

void KeptOps::Scope::finish() {
  if (!open_) return;
  close();
  if (recomputing_) {
    ops_.clear();
    return;
  }
  if (ops_.ran_.size() <= ops_.last_) {
    const auto missing = ops_.kept_.lower_bound(static_cast<std::uint32_t>(ops_.ran_.size()));
    ops_.clear();
    C10_THROW_ERROR(ValueError, "region '" + ops_.region_ + "' ran " + std::to_string(ops_.ran_.size()) +
                                    " ops, but the plan keeps op " + std::to_string(missing->first) + " (" +
                                    missing->second + ")" + profile_again(ops_.region_));
  }
  // The outputs and their other tensors themselves until now, so that writes into them counted;
  // from here a detached alias of each (sharing its version counter), which holds no part of
  // forward's graph. Made and let go outside the lock (a tensor subclass or a dispatch mode runs
  // Python there, which takes the GIL that a thread waiting for the lock may hold).
  for (auto& [index, held] : ops_.held_) {
    for (c10::IValue& value : held.returns) {
      c10::IValue swapped = fresh(value);
      std::lock_guard<std::mutex> lock(holding_mutex);
      std::swap(value, swapped);
    }
    for (at::Tensor& alias : held.aliases) {
      at::Tensor swapped = alias.detach();
      std::lock_guard<std::mutex> lock(holding_mutex);
      std::swap(alias, swapped);
    }
  }
}

void KeptOps::Scope::pass(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (!numbered(op)) return next(op, keys, stack);
  if (!recomputing_) {
    const auto index = static_cast<std::uint32_t>(ops_.ran_.size());
    ops_.ran_.emplace_back(op, c10::GradMode::is_enabled());
    const auto want = ops_.kept_.find(index);
    if (want != ops_.kept_.end()) return hold(op, keys, stack, index, want->second);
    next(op, keys, stack);
    if (!ops_.held_.empty() && !op.schema().is_mutable()) watch_aliases(op, stack);
    return;
  }
  const std::uint32_t index = count_++;
  if (index >= ops_.ran_.size() || !(ops_.ran_[index].first == op)) refuse(op, index);
  if (ops_.ran_[index].second != c10::GradMode::is_enabled()) {
    refuse(op, index,
           ops_.ran_[index].second ? "with gradients off, where forward ran it with them on"
                                   : "with gradients on, where forward ran it under no_grad");
  }
  if (!ops_.held_.empty() && hand_back(op, stack, index)) return;
  next(op, keys, stack);
}

void KeptOps::Scope::next(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (outer_ == nullptr) {
    run_below(op, keys, stack);
  } else {
    outer_->pass(op, keys, stack);
  }
}

void KeptOps::Scope::hold(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack,
                          std::uint32_t index, const std::string& want) {
  const std::string found = op_name(op);
  if (found != want) {
    C10_THROW_ERROR(ValueError, "region '" + ops_.region_ + "': op " + std::to_string(index) + " is " + found +
                                    ", but the plan keeps " + want + " there" + profile_again(ops_.region_));
  }
  const c10::FunctionSchema& schema = op.schema();
  const auto arguments = torch::jit::last(*stack, schema.arguments().size());
  std::unordered_set<const c10::StorageImpl*> inputs;
  for (const c10::IValue& value : arguments) {
    if (value.isTensor() && value.toTensor().has_storage())
      inputs.insert(value.toTensor().storage().unsafeGetStorageImpl());
  }
  Held held{{}, {}, input_shapes(arguments), trained_inputs(arguments)};
  next(op, keys, stack);
  const auto returns = torch::jit::last(*stack, schema.returns().size());
  bool fresh_storage = keepable(op) && plain_returns(returns);
  for (const c10::IValue& value : returns) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (!t.has_storage() || inputs.count(t.storage().unsafeGetStorageImpl()) != 0) fresh_storage = false;
      held.versions.push_back(version_of(t));
    });
  }
  if (!fresh_storage || held.versions.empty()) {
    C10_THROW_ERROR(ValueError, "region '" + ops_.region_ + "': op " + std::to_string(index) + " (" + found +
                                    ") returned no new storage to keep" + profile_again(ops_.region_));
  }
  held.returns.assign(returns.begin(), returns.end());
  std::lock_guard<std::mutex> lock(holding_mutex);
  ops_.held_.emplace(index, std::move(held));  // new: forward numbers each op once
  holding().insert(&ops_);
}

void KeptOps::Scope::watch_aliases(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::vector<std::pair<Held*, at::Tensor>> found;
  for (const c10::IValue& value : torch::jit::last(*stack, op.schema().returns().size())) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      for (auto& [index, held] : ops_.held_) {
        bool over = false;
        for (const c10::IValue& kept : held.returns) {
          for_each_tensor(kept, [&](const at::Tensor& k) {
            over = over || (k.defined() && k.has_storage() && k.storage().unsafeGetStorageImpl() == storage &&
                            k.unsafeGetTensorImpl() != t.unsafeGetTensorImpl());
          });
        }
        if (over) found.emplace_back(&held, t);
      }
    });
  }
  if (found.empty()) return;
  std::lock_guard<std::mutex> lock(holding_mutex);
  for (auto& [held, alias] : found) {
    held->alias_versions.push_back(version_of(alias));
    held->aliases.push_back(std::move(alias));
  }
}

bool KeptOps::Scope::hand_back(const c10::OperatorHandle& op, torch::jit::Stack* stack, std::uint32_t index) {
  std::unique_lock<std::mutex> lock(holding_mutex);
  const auto found = ops_.held_.find(index);
  if (found == ops_.held_.end()) return false;
  Held held = std::move(found->second);
  ops_.held_.erase(found);
  lock.unlock();
  const std::size_t argument_count = op.schema().arguments().size();
  const auto arguments = torch::jit::last(*stack, argument_count);
  const Shapes shapes = input_shapes(arguments);
  if (shapes != held.inputs) {
    refuse(op, index, "on inputs " + describe(shapes) + ", where forward ran it on " + describe(held.inputs));
  }
  const std::vector<TrainedInput> trained = trained_inputs(arguments);
  for (std::size_t a = 0; a < trained.size(); ++a) {
    const TrainedInput& then = held.trained[a];
    if (then.tensor != nullptr && trained[a].tensor != then.tensor && trained[a].storage != then.storage) {
      refuse(op, index,
             "on another tensor as its input " + std::to_string(a) +
                 ", where forward read a weight that "
                 "takes gradients there");
    }
  }
  std::size_t i = 0;
  bool unchanged = true;
  for (const c10::IValue& value : held.returns) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (t.defined() && version_of(t) != held.versions[i]) unchanged = false;
      i += t.defined() ? 1 : 0;
    });
  }
  for (std::size_t a = 0; a < held.aliases.size(); ++a) {
    if (version_of(held.aliases[a]) != held.alias_versions[a]) unchanged = false;
  }
  if (!unchanged) return false;  // written into after forward held it: the op runs again
  torch::jit::drop(*stack, argument_count);
  for (const c10::IValue& value : held.returns) stack->push_back(fresh(value));
  return true;
}

void KeptOps::Scope::refuse(const c10::OperatorHandle& op, std::uint32_t index, const std::string& how) {
  const std::string forward = index < ops_.ran_.size() ? op_name(ops_.ran_[index].first) : "no op";
  const std::string ran =
      how.empty() ? "ran " + op_name(op) + " as op " + std::to_string(index) + ", where forward ran " + forward
                  : "ran op " + std::to_string(index) + " (" + forward + ") " + how;
  C10_THROW_ERROR(ValueError, "region '" + ops_.region_ + "': recompute " + ran +
                                  ": the region's code takes another path in recompute (is_recomputing(), state a "
                                  "recompute hook does not restore, a decision replayed with gradients on); per-op "
                                  "plans need the same ops in both");
}

}  // namespace remat
