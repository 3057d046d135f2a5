#pragma once
// The default generators' states as one value (the CPU generator's, and each CUDA device's that
// has a context), to tell whether anything drew random numbers between two points: a recompute
// that draws, in a checkpoint keeping no RNG state, draws other numbers than forward did.

#include <any>

namespace remat::detail {

std::any generator_states();

// Whether nothing drew random numbers (nor reseeded) between the points where generator_states()
// gave `before` and `after`.
bool same_generator_states(const std::any& before, const std::any& after);

}  // namespace remat::detail
