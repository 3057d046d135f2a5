#pragma once
// A plan from each region's choice, save, recompute or offload (at its copy seconds), with the
// figures both offload solvers report (kept and host bytes, recompute and copy seconds) summed
// one way; which regions may be offloaded within a host budget; and whether a profile can be
// planned with offload at all.

#include <remat/budget/plan.hpp>

#include <cstdint>
#include <vector>

namespace remat::budget::detail {

// Whether `region` may be offloaded within `host_budget_bytes`: it has bytes to move and they fit.
inline bool offloadable_within(const RegionCost& region, std::uint64_t host_budget_bytes) {
  return region.offload_bytes > 0 && region.offload_bytes <= host_budget_bytes;
}

// Throws BudgetError where a plan may offload (`host_budget_bytes` more than 0) but the profile
// has no copy bandwidth to price it by, or its regions' offload_bytes add up past 64 bits (the
// host totals would wrap; the profile reader refuses such a dump too).
void check_offloadable(const RegionProfile& profile, std::uint64_t host_budget_bytes);

// offloaded[r]: region r goes to the host (its choice is save); copy_seconds[r]: what that costs.
Plan offload_plan_of(const RegionProfile& profile, const std::vector<Choice>& choices, std::vector<bool> offloaded,
                     const std::vector<double>& copy_seconds, std::uint64_t host_budget_bytes);

}  // namespace remat::budget::detail
