#pragma once
// The autograd engine the runtime installs (engine.cpp): its default saved-variable hooks
// consult the thread state (thread_state.hpp) and hand everything else to PyTorch's.

namespace remat::detail {

// Installs the autograd engine whose default saved-variable hooks consult the thread state.
void ensure_engine_installed();

// Counts the trackings active in the process (remat_alloc.track with remat's hooks: `change` +1 as
// one begins, -1 as it ends; tracking.hpp's ActiveTracking). While there is one, what autograd saves
// outside checkpoints and tracked forwards is an activation as well (a loss computed after the
// model), and where backward unpacks it, what backward allocates from there is a temporary of
// "(backward)" until it reaches a tracked module.
void count_active_trackings(int change);

// Once per backward (graph task) running on this thread: its end puts back the category in force
// now (none, or the caller's own: a backward inside a category scope, in LBFGS's closure).
void restore_category_when_backward_ends();

// Throws c10::NotImplementedError (Python's NotImplementedError): tracking does not work under
// compiled autograd, which cannot trace its C++ backward hooks nor what they saved.
[[noreturn]] void refuse_tracking_under_compiled_autograd();

}  // namespace remat::detail
