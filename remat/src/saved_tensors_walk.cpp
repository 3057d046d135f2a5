// The walk of a loss's graph (remat/saved_tensors_walk.hpp): entered per thread, it collects
// the checkpoints whose saved tensors it read.

#include <remat/saved_tensors_walk.hpp>

#include "frame.hpp"
#include "live_frames.hpp"

#include <remat/errors.hpp>

#include <utility>

namespace remat {
namespace detail {
namespace {

thread_local SavedTensorsWalk* t_walk = nullptr;  // the walk entered on this thread

}  // namespace

SavedTensorsWalk* entered_walk() { return t_walk; }

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

void SavedTensorsWalk::note_live_checkpoints() {
  detail::for_each_live_frame([&](detail::Frame& frame) {
    if (auto held = frame.weak_from_this().lock()) note_checkpoint(held);  // null: being destroyed
  });
}

}  // namespace remat
