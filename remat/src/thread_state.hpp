#pragma once
// What the checkpoint runtime knows about this thread: which checkpoint's forward or recompute
// runs here (a raw pointer, for the hot paths), which frame new saved-variable hooks belong to
// (a shared pointer, so the hooks own it), whose body runs (its caller's state), and how deep
// PyTorch's own stack of saved-tensor hooks was when it began.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace remat {
struct CheckpointCaller;
}  // namespace remat

namespace remat::detail {

struct Frame;

enum class Mode : std::uint8_t { none, forward, recompute };

struct ThreadState {
  Frame* frame = nullptr;
  Mode mode = Mode::none;
  // The save region whose body runs now: in forward, or in recompute where it runs again
  // (SaveRegionRecord::rerun_reason), whose saved tensors are those forward kept.
  int save_region = -1;
  bool in_region = false;
  const std::string* region = nullptr;  // name of the region whose body runs now
  // Saved-tensor hooks on PyTorch's stack (Python's saved_tensors_hooks) when this forward or
  // recompute began: hooks pushed inside the body take the tensors saved under them.
  std::size_t user_hooks_depth = 0;
};

ThreadState& thread_state();

// Sets the thread state for a scope and puts the previous one back.
class ThreadStateScope {
 public:
  explicit ThreadStateScope(const ThreadState& next) : previous_(thread_state()) { thread_state() = next; }
  ~ThreadStateScope() { thread_state() = previous_; }
  ThreadStateScope(const ThreadStateScope&) = delete;
  ThreadStateScope& operator=(const ThreadStateScope&) = delete;

 private:
  ThreadState previous_;
};

// Frames are owned by the hooks of the tensors they dropped; the running one is reachable from
// the thread state as a raw pointer, and from here as a shared pointer for new hooks.
const std::shared_ptr<Frame>& frame_owner();

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

// Makes `caller` the one checkpoint_caller() returns, for a scope: the body of its call.
class CallerScope {
 public:
  explicit CallerScope(CheckpointCaller* caller);
  ~CallerScope();
  CallerScope(const CallerScope&) = delete;
  CallerScope& operator=(const CallerScope&) = delete;

 private:
  CheckpointCaller* previous_;
};

// Saved-tensor hooks on PyTorch's stack (Python's saved_tensors_hooks; always 0 in a C++
// program).
std::size_t user_hooks_depth();

// Forwards of tracked models (remat_alloc.track, remat/tracking.hpp) running on this thread: what
// autograd saves outside checkpoints meanwhile gets the engine's activation hooks.
int& tracked_forwards();

}  // namespace remat::detail
