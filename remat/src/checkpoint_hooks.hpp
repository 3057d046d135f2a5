#pragma once
// The saved-variable hooks a checkpoint attaches to every tensor autograd saves while its forward
// or recompute runs on this thread: what each saved tensor becomes (kept, packed, taken again
// from a region's input, or dropped for recompute) and how backward gets it back.

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <memory>

namespace remat::detail {

struct Frame;
struct ThreadState;

// Hooks for one tensor saved under `state` (forward or recompute of `frame`).
std::unique_ptr<torch::autograd::SavedVariableHooks> make_checkpoint_hooks(std::shared_ptr<Frame> frame,
                                                                           const ThreadState& state);

}  // namespace remat::detail
