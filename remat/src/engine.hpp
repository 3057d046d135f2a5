#pragma once
// The autograd engine the runtime installs (engine.cpp): its default saved-variable hooks
// consult the thread state (frame.hpp) and hand everything else to PyTorch's.

#include <cstddef>
#include <memory>

namespace remat::detail {

struct Frame;

// Makes `frame` the one new saved-variable hooks belong to, for a scope.
class FrameOwnerScope {
 public:
  explicit FrameOwnerScope(std::shared_ptr<Frame> frame);
  ~FrameOwnerScope();
  FrameOwnerScope(const FrameOwnerScope&) = delete;
  FrameOwnerScope& operator=(const FrameOwnerScope&) = delete;

 private:
  std::shared_ptr<Frame> previous_;
};

// Installs the autograd engine whose default saved-variable hooks consult the thread state
// (engine.cpp).
void ensure_engine_installed();

// Saved-tensor hooks on PyTorch's stack (Python's saved_tensors_hooks; always 0 in a C++
// program).
std::size_t user_hooks_depth();

}  // namespace remat::detail
