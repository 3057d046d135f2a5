#pragma once
// State that recompute must see exactly as forward did (an RNG, a step counter):
// snapshotted at checkpoint entry and after each save region in forward, restored at the
// matching points in recompute; the state in force when recompute starts is put back
// after it.

#include <any>
#include <memory>

namespace remat {

class RecomputeStateHook {
 public:
  virtual ~RecomputeStateHook() = default;
  virtual std::any snapshot() = 0;
  virtual void restore(const std::any& state) = 0;
};

// The default CPU generator (dropout, randn, ...).
std::shared_ptr<RecomputeStateHook> cpu_rng_state_hook();

namespace detail {
// The default generators of the CUDA devices that have a context when it snapshots (none where
// LibTorch has no CUDA), through libtorch_cpu's device-generic hooks: what the runtime keeps
// under a budget plan beside the CPU generator (CheckpointOptions::plan), with no CUDA library
// linked. remat::cuda_rng_state_hook() is the one to pass yourself.
std::shared_ptr<RecomputeStateHook> cuda_generators_state_hook();
}  // namespace detail

}  // namespace remat
