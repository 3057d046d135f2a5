#pragma once
// Per-op budget plans: for each region, save it, recompute it, or recompute it keeping the
// outputs of chosen ops (recompute then takes those instead of running the ops again), chosen
// from a profile's per-op figures (RegionCost::ops) so that what the checkpoints keep fits a
// budget and the step spends the least time. A multiple-choice knapsack: exact where its search
// ends within its bounds, else the best plan found, marked not exact, with a bound on the best.

#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <cstdint>
#include <vector>

namespace remat::budget {

// The seconds a recomputed region costs the step while keeping `kept` (ops of it): its forward
// seconds less the kept ops' seconds, plus twice its op overhead (forward and recompute watch its
// ops) where it keeps any.
double keeping_seconds(const RegionCost& region, const std::vector<OpCost>& kept);

// The plan with the least recompute seconds (as keeping_seconds counts them) whose kept bytes
// (base_bytes, the saved regions' bytes and the kept ops' bytes) are at most `budget_bytes`.
// Regions without per-op figures choose between save and recompute. Throws BudgetError for a
// budget below base_bytes, or a grouped profile (whose ops no runtime region matches).
Plan solve_ops(const RegionProfile& profile, std::uint64_t budget_bytes);

// The per-op plan with the least recompute seconds (as keeping_seconds counts them) whose
// predicted step peak, kept ops counted (predict_step_peak), is at most `peak_bytes`
// (Plan::peak_bytes). Every plan is weighed where a profile has few (each region saved, recomputed,
// or recomputed keeping any subset of its ops: at most 2^16 plans in all), which proves the plan;
// beyond, the plan by regions alone (solve_peak), the fastest per-op plan with no limit, per-op
// plans at a price per byte kept bisected against the peak and, where the profile has at most 4096
// ops a plan may keep, solve_ops's plans at budgets bisected against the peak; the fastest within
// the peak, marked not exact. Throws
// BudgetError naming the least peak any plan reaches where none fits, and for a profile without
// step memory, a grouped one, or a step that does not list the ops of its regions.
Plan solve_peak_ops(const RegionProfile& profile, std::uint64_t peak_bytes);

// Per-op plans with offload as a fourth option (offload_plan.hpp): each region saved, recomputed,
// recomputed keeping some of its ops, or offloaded (saved, what it keeps on the host, its copies
// priced by offload_seconds). solve_ops_offload: the least time with what the checkpoints keep on
// the device within `budget_bytes` (kept ops counted, offloaded regions not) and the offloaded
// regions' offload_bytes within `host_budget_bytes`; proved where the host budget holds every
// offload its plan makes and OpSolver proves that plan, where the best plan meets the bound of a
// price on host bytes, or where every set of offloads was weighed (at most 12 regions offloadable),
// else marked not exact with that bound (op_offload_plan.cpp says how). solve_peak_ops_offload: the same by
// predicted step peak, as solve_peak_ops weighs plans (every plan where a profile has few, with
// offload among each region's options; beyond, the plans the other solvers make, offload ones
// included). A host budget of 0 offloads nothing. Both throw as solve_ops and solve_peak_ops do,
// and for a host budget above 0 on a profile without copy figures.
Plan solve_ops_offload(const RegionProfile& profile, std::uint64_t budget_bytes, std::uint64_t host_budget_bytes);
Plan solve_peak_ops_offload(const RegionProfile& profile, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes);

}  // namespace remat::budget
