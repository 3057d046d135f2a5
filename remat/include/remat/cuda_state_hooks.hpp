#pragma once
// Recompute state for CUDA tensors (remat::cuda): the CUDA generator that dropout and
// randn on the GPU draw from, so recompute replays the same random numbers.

#include <remat/state_hooks.hpp>

#include <memory>

namespace remat {

// The default CUDA generator of `device` (-1: the current device when the hook is made).
std::shared_ptr<RecomputeStateHook> cuda_rng_state_hook(int device = -1);

}  // namespace remat
