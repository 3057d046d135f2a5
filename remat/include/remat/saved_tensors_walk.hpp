#pragma once
// What saved_report() (remat/saved_report.hpp) is given by a caller that reads the saved
// tensors of the graph behind a loss itself.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace remat {

namespace detail {
struct Frame;
}  // namespace detail

// A walk of the graph behind a loss by a caller that can read the nodes' saved tensors (the
// Python layer, through their `_saved_*` attributes). While entered on a thread, unpacking a
// tensor a checkpoint dropped there raises an Error starting with kDroppedForRecompute instead
// of running recompute, and every checkpoint whose saved tensors are read is noted.
class SavedTensorsWalk {
 public:
  static constexpr const char* kDroppedForRecompute = "remat: dropped for recompute";

  struct NodeSaves {
    std::string node;       // "TanhBackward0"
    std::uintptr_t id = 0;  // tells nodes of one name apart
    std::vector<at::Tensor> tensors;
  };

  SavedTensorsWalk() = default;
  SavedTensorsWalk(const SavedTensorsWalk&) = delete;
  SavedTensorsWalk& operator=(const SavedTensorsWalk&) = delete;
  ~SavedTensorsWalk();

  void enter();
  void exit();
  // What one node saved, read by the caller while entered.
  void add_node(NodeSaves saves) { nodes_.push_back(std::move(saves)); }
  // Called by the runtime's unpack of a checkpoint's saved tensor while entered.
  void note_checkpoint(const std::shared_ptr<detail::Frame>& frame);
  // Notes every live checkpoint (forward finished, backward may still need it): the report
  // without roots covers them all.
  void note_live_checkpoints();

  const std::vector<NodeSaves>& nodes() const { return nodes_; }
  const std::vector<std::shared_ptr<detail::Frame>>& checkpoints() const { return checkpoints_; }

 private:
  std::vector<NodeSaves> nodes_;
  std::vector<std::shared_ptr<detail::Frame>> checkpoints_;
  SavedTensorsWalk* previous_ = nullptr;
  bool entered_ = false;
};

namespace detail {
// The walk entered on this thread, or null.
SavedTensorsWalk* entered_walk();
}  // namespace detail

}  // namespace remat
