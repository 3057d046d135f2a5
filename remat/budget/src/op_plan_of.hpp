#pragma once
// A per-op plan from each region's choice and the ops each recomputed region keeps, with the
// figures both per-op solvers report (kept bytes, recompute seconds) summed one way.

#include <remat/budget/plan.hpp>

#include <vector>

namespace remat::budget::detail {

// kept[r]: the ops of region r (entries of its RegionCost::ops) it keeps while it recomputes;
// empty for a saved region. The plan's budget_bytes is left for the solver to set.
Plan op_plan_of(const RegionProfile& profile, const std::vector<Choice>& choices,
                std::vector<std::vector<OpCost>> kept);

}  // namespace remat::budget::detail
