#pragma once
// Sums of a profiled step's byte figures (step_model.hpp).

#include <remat/budget/error.hpp>

#include <cstdint>

namespace remat::budget::detail {

// The dump reader bounds each figure, so only a step made some other way can pass 2^64; it is
// refused rather than wrapped into a small peak.
inline std::uint64_t add_bytes(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    throw BudgetError(
        "the step's byte figures add up past 64 bits, so no step peak can be predicted from them: the "
        "step is not a real one; profile it again");
  }
  return sum;
}

}  // namespace remat::budget::detail
