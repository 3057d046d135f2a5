// The live frames (live_frames.hpp).

#include "live_frames.hpp"

#include <algorithm>
#include <iterator>
#include <mutex>
#include <vector>

namespace remat::detail {
namespace {

struct LiveFrames {
  std::mutex mutex;
  std::vector<Frame*> frames;  // in registration order
};

LiveFrames& live_frames() {
  static auto* instance = new LiveFrames();  // frames may be destroyed during shutdown
  return *instance;
}

}  // namespace

void add_live_frame(Frame* frame) {
  LiveFrames& registry = live_frames();
  std::lock_guard lock(registry.mutex);
  registry.frames.push_back(frame);
}

void remove_live_frame(Frame* frame) {
  LiveFrames& registry = live_frames();
  std::lock_guard lock(registry.mutex);
  // Searched from the newest: backward frees checkpoints in about the reverse of their forward
  // order, so a step of many checkpoints finds each at once instead of scanning all of them.
  const auto newest_first = std::find(registry.frames.rbegin(), registry.frames.rend(), frame);
  if (newest_first != registry.frames.rend()) registry.frames.erase(std::next(newest_first).base());
}

void for_each_live_frame(const std::function<void(Frame&)>& visit) {
  LiveFrames& registry = live_frames();
  std::lock_guard lock(registry.mutex);
  for (Frame* frame : registry.frames) visit(*frame);
}

}  // namespace remat::detail
