#pragma once
// Which saved tensors exist right now, and which autograd node saved each: recorded by the
// saved-variable hooks while SavedTensorsTracking is on, read by saved_report().

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace remat::detail {

struct Frame;

struct SavedEntry {
  std::uint64_t thread = 0;    // of the node that saved it (Node::thread_id())
  std::uint64_t sequence = 0;  // of the node that saved it (Node::sequence_nr())
  at::Tensor tensor;           // resident tensor; undefined when dropped for recompute
  std::string checkpoint;      // "" outside checkpoints
  std::weak_ptr<Frame> frame;  // the checkpoint that will recreate a dropped tensor
};

bool saved_tracking_enabled();
void set_saved_tracking(bool enabled);

// The node being built on this thread: saves happen right after their node is created.
SavedEntry entry_for_current_node();

void register_saved(const void* owner, SavedEntry entry);
void unregister_saved(const void* owner);
std::vector<SavedEntry> saved_entries();

}  // namespace remat::detail
