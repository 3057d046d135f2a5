#pragma once
// What a checkpoint carries from forward into recompute besides tensors: its per-call contexts,
// entered in order and exited in reverse, and the snapshots of its state hooks.

#include <remat/context.hpp>
#include <remat/state_hooks.hpp>

#include <algorithm>
#include <any>
#include <cstdio>
#include <exception>
#include <memory>
#include <typeinfo>
#include <vector>

namespace remat::detail {

// Enters contexts in order and exits them in reverse, also when the body throws.
class ContextScope {
 public:
  ContextScope(std::vector<std::unique_ptr<CheckpointContext>>& contexts, bool recompute)
      : contexts_(contexts), recompute_(recompute) {
    for (auto& context : contexts_) {
      recompute_ ? context->enter_recompute() : context->enter_forward();
      ++entered_;
    }
  }
  // While another error unwinds, a context that fails on exit can only be reported.
  ~ContextScope() {
    while (entered_ > 0) {
      try {
        exit_next();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "remat: a checkpoint context failed on exit: %s\n", e.what());
      }
    }
  }
  // After the body returned: exits every context, then rethrows the first failure (a Python
  // context's KeyboardInterrupt, for one).
  void close() {
    std::exception_ptr first;
    while (entered_ > 0) {
      try {
        exit_next();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  void exit_next() {
    auto& context = contexts_[--entered_];
    recompute_ ? context->exit_recompute() : context->exit_forward();
  }

  std::vector<std::unique_ptr<CheckpointContext>>& contexts_;
  bool recompute_;
  std::size_t entered_ = 0;
};

// `hooks` with the runtime's RNG state hooks added, the CPU generator's where none of `hooks` is
// that one, and the CUDA generators': what a checkpoint runs with under a budget plan, which may
// recompute a region its code saves, whose random draws (dropout's masks) no hook of the code's
// keeps, since the code never draws them again. A caller's own cuda_rng_state_hook() (remat::cuda,
// a type the core cannot see) keeps the same state again, which restores to the same values.
inline std::vector<std::shared_ptr<RecomputeStateHook>> with_rng_state_hooks(
    std::vector<std::shared_ptr<RecomputeStateHook>> hooks) {
  static const std::shared_ptr<RecomputeStateHook> cpu = cpu_rng_state_hook();  // they hold no state
  static const std::shared_ptr<RecomputeStateHook> cuda = cuda_generators_state_hook();
  const RecomputeStateHook& cpu_hook = *cpu;
  const std::type_info& cpu_type = typeid(cpu_hook);
  const bool kept = std::any_of(hooks.begin(), hooks.end(), [&](const std::shared_ptr<RecomputeStateHook>& hook) {
    if (!hook) return false;
    const RecomputeStateHook& each = *hook;
    return typeid(each) == cpu_type;
  });
  if (!kept) hooks.push_back(cpu);
  hooks.push_back(cuda);
  return hooks;
}

inline std::vector<std::any> snapshot_states(const std::vector<std::shared_ptr<RecomputeStateHook>>& hooks) {
  std::vector<std::any> out;
  out.reserve(hooks.size());
  for (const auto& hook : hooks) out.push_back(hook->snapshot());
  return out;
}

inline void restore_states(const std::vector<std::shared_ptr<RecomputeStateHook>>& hooks, const std::vector<std::any>& states) {
  for (std::size_t i = 0; i < hooks.size(); ++i) hooks[i]->restore(states[i]);
}

}  // namespace remat::detail
