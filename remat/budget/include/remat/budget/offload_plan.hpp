#pragma once
// Offload plans: for each region, save it (its bytes stay on the device), recompute it, or offload
// it (saved, but what it keeps goes to the host and comes back ahead of backward, through
// remat.CpuOffload), so that what the checkpoints keep on the device fits a budget, what they hold
// on the host fits a host budget, and the step spends the least time. Priced from the copy
// bandwidth the profile measured (RegionProfile::host_copy) and each region's offload_bytes.

#include <remat/budget/plan.hpp>

#include <cstdint>

namespace remat::budget {

// What offloading `region` costs the step, as the model prices it: the copy to the host and the
// copy back (bytes / bandwidth each way). On a GPU ("cuda" profiles) each copy runs on a stream of
// its own beside compute and costs only what it takes beyond the region's own forward seconds
// (max(0, copy - seconds), each way); on the CPU a copy is work on the same cores and costs its
// whole time. A group of grouped() costs its regions' copies added up (members_offload_seconds).
// Throws BudgetError for a profile without copy figures.
double offload_seconds(const RegionProfile& profile, const RegionCost& region);

// The plan with the least step time added (recomputed regions' seconds plus offloaded regions'
// offload_seconds) whose kept bytes (base_bytes and the saved regions' bytes; offloaded regions
// keep none on the device) are at most `budget_bytes` and whose host_bytes (the offloaded regions'
// offload_bytes) are at most `host_budget_bytes`. Exact where its search ends (Plan::exact), else
// the best plan found with a bound on the best (least_recompute_seconds). A host budget of 0 makes
// the plan solve() makes. Throws BudgetError for a budget below base_bytes, or a host budget above
// 0 on a profile without copy figures.
Plan solve_offload(const RegionProfile& profile, std::uint64_t budget_bytes, std::uint64_t host_budget_bytes);

// The plan with the least step time added (as solve_offload counts it) whose predicted step peak
// (predict_step_peak with its offloaded regions: what stays on the device) is at most `peak_bytes`
// and whose host_bytes are at most `host_budget_bytes` (Plan::peak_bytes, Plan::host_bytes). Every
// plan is weighed where the search ends within its limit (Plan::exact), else the best one found is
// kept, marked not exact. A host budget of 0 offloads nothing. Throws BudgetError naming the least
// peak any plan reaches with that host budget where none fits, for a profile without step memory,
// or a host budget above 0 on a profile without copy figures or on a grouped one (a region that
// stands for several: the step model brings offloaded bytes back region by region).
Plan solve_peak_offload(const RegionProfile& profile, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes);

// The least step peak any plan reaches with `host_budget_bytes` on the host (among those
// solve_peak_offload weighs).
std::uint64_t least_step_peak_offload(const RegionProfile& profile, std::uint64_t host_budget_bytes);

}  // namespace remat::budget
