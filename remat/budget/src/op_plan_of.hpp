#pragma once
// A per-op plan from each region's choice and the ops each recomputed region keeps, with the
// figures both per-op solvers report (kept bytes, recompute seconds) summed one way; and the
// per-op plans at a price per byte kept, which the plans by peak weigh by the dozen.

#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace remat::budget::detail {

// kept[r]: the ops of region r (entries of its RegionCost::ops) it keeps while it recomputes;
// empty for a saved region. The plan's budget_bytes is left for the solver to set.
Plan op_plan_of(const RegionProfile& profile, const std::vector<Choice>& choices,
                std::vector<std::vector<OpCost>> kept);

// The same with regions offloaded (offloaded[r]: region r, whose choice is save, goes to the host;
// copy_seconds[r]: what that costs), as offload_plan_of counts them.
Plan op_offload_plan_of(const RegionProfile& profile, const std::vector<Choice>& choices,
                        std::vector<std::vector<OpCost>> kept, const std::vector<bool>& offloaded,
                        const std::vector<double>& copy_seconds, std::uint64_t host_budget_bytes);

// Throws BudgetError for a grouped profile with per-op figures (ops are kept by region).
void refuse_grouped_ops(const RegionProfile& profile);

// The op of `region` with OpCost::index `index`, which it has.
const OpCost& op_at(const RegionCost& region, std::uint32_t index);

// The seconds a recomputed region costs keeping its ops with these indexes (as keeping_seconds).
double keeping_seconds(const RegionCost& region, const std::vector<std::uint32_t>& kept);

// A per-op plan as predict_step_peak takes it: each region's choice, and the ops each keeps.
struct OpChoices {
  std::vector<Choice> choices;
  KeptOps kept;
};

// solve_ops's Lagrangian plans with no budget: at a price per byte kept, each region takes its
// best option alone (saved where that spares the most, else keeping exactly the ops that spare more
// than their bytes cost). The higher the price, the less they keep. One pass over the ops a plan.
class PricedOpPlans {
 public:
  explicit PricedOpPlans(const RegionProfile& profile);  // throws BudgetError for a grouped profile
  ~PricedOpPlans();

  // The least and the most seconds spared per byte of any option: at or below the least price
  // every option worth taking is taken, at or above the most none is.
  std::pair<double, double> price_range() const;
  OpChoices at(double per_byte) const;

 private:
  struct Solver;
  const RegionProfile& profile_;
  std::unique_ptr<Solver> solver_;
};

}  // namespace remat::budget::detail
