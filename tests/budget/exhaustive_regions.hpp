#pragma once
// The region solver's answer by brute force, for tests on small profiles.

#include <remat/budget/plan.hpp>

#include <cstdint>

namespace remat::budget::brute_force {

// The least recompute seconds over every subset of regions saved that fits the budget and saves
// each region that must be saved.
inline double exhaustive_best(const RegionProfile& profile, std::uint64_t budget) {
  const std::size_t n = profile.regions.size();
  double best = 1e300;
  for (std::uint64_t mask = 0; mask < (std::uint64_t{1} << n); ++mask) {
    std::uint64_t kept = profile.base_bytes;
    double recompute = 0;
    bool allowed = true;
    for (std::size_t r = 0; r < n; ++r) {
      if ((mask >> r) & 1) {
        kept += profile.regions[r].saved_bytes;
      } else {
        recompute += profile.regions[r].seconds;
        allowed = allowed && profile.regions[r].must_save.empty();
      }
    }
    if (allowed && kept <= budget && recompute < best) best = recompute;
  }
  return best;
}

}  // namespace remat::budget::brute_force
