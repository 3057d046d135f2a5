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

}  // namespace remat
