#pragma once
// The autograd engine the runtime installs (engine.cpp): its default saved-variable hooks
// consult the thread state (thread_state.hpp) and hand everything else to PyTorch's.

namespace remat::detail {

// Installs the autograd engine whose default saved-variable hooks consult the thread state.
void ensure_engine_installed();

}  // namespace remat::detail
