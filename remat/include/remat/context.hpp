#pragma once
// Per-call contexts around a checkpoint's forward and its recompute. A factory in
// CheckpointOptions makes one context per checkpoint call, so two calls of one block (or
// two microbatches in flight) never share state.

#include <functional>
#include <memory>

namespace remat {

class CheckpointContext {
 public:
  virtual ~CheckpointContext() = default;
  virtual void enter_forward() {}
  virtual void exit_forward() {}
  // Called around every recompute of this call (a second backward recomputes again).
  virtual void enter_recompute() {}
  virtual void exit_recompute() {}
};

using CheckpointContextFactory = std::function<std::unique_ptr<CheckpointContext>()>;

}  // namespace remat
