#pragma once
// The bytes autograd keeps for backward, from a loss tensor: grouped by checkpoint (identical
// checkpoints folded: "96 B  x2  layer.0-1  (2 storages each)"), the rest by the autograd
// node that saved them ("48 B  TanhBackward0 (x1)"). A storage is billed once.
//
//   {
//     remat::SavedTensorsTracking tracking;  // around the forward
//     loss = model(x);
//   }
//   std::puts(remat::saved_report(loss).format().c_str());

#include <remat/diagnostics.hpp>
#include <remat/saved_tensors_walk.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace remat {

// While alive, tensors autograd saves on this thread are recorded for saved_report(). It
// wraps them in pass-through saved-tensor hooks, which (as any hooks do) skip autograd's
// in-place modification check for them.
class SavedTensorsTracking {
 public:
  SavedTensorsTracking();
  ~SavedTensorsTracking();
  SavedTensorsTracking(const SavedTensorsTracking&) = delete;
  SavedTensorsTracking& operator=(const SavedTensorsTracking&) = delete;

 private:
  bool previous_;
};

struct SavedGroup {
  std::string label;          // "layer.0-1" or "TanhBackward0"
  std::int64_t bytes = 0;     // all members together
  std::int64_t count = 0;     // checkpoints folded together, or nodes of that name
  std::int64_t storages = 0;  // all members together
  std::string first_member;   // "layer.0": whose memory report the region detail shows
};

struct SavedReport {
  std::int64_t total_bytes = 0;
  std::int64_t region_bytes = 0;
  std::int64_t outside_bytes = 0;
  std::int64_t regions = 0;
  std::vector<SavedGroup> region_groups;  // largest first
  std::vector<SavedGroup> node_groups;    // largest first
  // Per region group, in its order: its first member's memory report (empty when that
  // checkpoint is no longer alive).
  std::vector<MemoryReport> details;
  std::string format() const;
  std::string to_json() const;  // kind "saved-report"
};

// What is kept behind `loss`: the checkpoints and nodes `walk` read (when given), and what
// SavedTensorsTracking recorded of the nodes behind it (the nodes `walk` read replace those).
SavedReport saved_report(const at::Tensor& loss, const SavedTensorsWalk* walk = nullptr);

}  // namespace remat
