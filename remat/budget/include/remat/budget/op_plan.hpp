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

}  // namespace remat::budget
