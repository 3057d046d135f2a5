#pragma once
// The budget/time frontier of a region profile as a standalone SVG (remat-report advise --svg):
// recompute seconds of the fastest plan against its budget, a step for every budget where the
// plan changes, and the plan's own bytes marked on it. Self-contained; every text escaped.

#include <remat/budget/plan.hpp>

#include <cstdint>

#include <string>
#include <vector>

namespace remat::report {

std::string frontier_svg(const budget::RegionProfile& profile, const std::vector<budget::Plan>& plans,
                         const std::string& source);

// The same against the step's peak (advise --peak --svg): each plan by peak (solve_peak) from its
// peak budget to the next one's, marked at its predicted peak; below the least peak, no plan.
std::string peak_frontier_svg(const budget::RegionProfile& profile, const std::vector<budget::Plan>& plans,
                              std::uint64_t least_peak_bytes, const std::string& source);

}  // namespace remat::report
