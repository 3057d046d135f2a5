// Per-op plans by kept bytes (op_plan.hpp), solved by OpSolver (op_solver.hpp, which says how),
// and the parts of a per-op plan every per-op solver shares.

#include <remat/budget/op_plan.hpp>

#include "op_plan_of.hpp"
#include "op_solver.hpp"
#include "plannable.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace remat::budget {

using detail::OpGroup;
using detail::OpMode;
using detail::OpSolver;

double keeping_seconds(const RegionCost& region, const std::vector<OpCost>& kept) {
  if (kept.empty()) return region.seconds;
  double seconds = region.seconds + 2 * region.op_overhead_seconds;
  for (const OpCost& op : kept) seconds -= op.seconds;
  return seconds;
}

double detail::keeping_seconds(const RegionCost& region, const std::vector<std::uint32_t>& kept) {
  if (kept.empty()) return region.seconds;
  double seconds = region.seconds + 2 * region.op_overhead_seconds;
  for (const std::uint32_t index : kept) seconds -= detail::op_at(region, index).seconds;
  return seconds;
}

void detail::refuse_grouped_ops(const RegionProfile& profile) {
  for (const RegionCost& region : profile.regions) {
    if (region.count != 1 && !region.ops.empty()) {
      throw BudgetError("region '" + region.name + "' stands for " + std::to_string(region.count) +
                        " regions (a grouped profile) and has per-op figures: ops are kept by region, so plan per op "
                        "from the profile as measured (group=False)");
    }
  }
}

std::vector<OpGroup> detail::op_groups(const RegionProfile& profile, std::uint64_t capacity,
                                       std::vector<Choice>& choices, bool every_region) {
  std::vector<OpGroup> groups;
  weigh_regions(profile, capacity, choices, [&](const Weighed& weighed) {
    const RegionCost& region = profile.regions[weighed.region];
    OpGroup g(weighed);
    g.overhead = 2 * region.op_overhead_seconds;
    for (std::size_t o = 0; o < region.ops.size(); ++o) {
      const OpCost& op = region.ops[o];
      if (op.bytes > 0 && op.seconds > 0 && op.bytes <= capacity) g.ops.push_back(o);
    }
    if (every_region || g.can_save || !g.ops.empty()) groups.push_back(std::move(g));
  });
  return groups;
}

std::vector<std::vector<OpCost>> detail::kept_ops_of(const RegionProfile& profile, const std::vector<OpGroup>& groups,
                                                     const OpSolver::Choice& chosen, std::vector<Choice>& choices) {
  std::vector<std::vector<OpCost>> kept(profile.regions.size());
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const RegionCost& region = profile.regions[groups[k].region];
    if (chosen.mode[k] == OpMode::save) choices[groups[k].region] = Choice::save;
    if (chosen.mode[k] != OpMode::ops) continue;
    for (const std::size_t o : chosen.kept[k]) kept[groups[k].region].push_back(region.ops[o]);
  }
  return kept;
}

Plan solve_ops(const RegionProfile& profile, std::uint64_t budget_bytes) {
  const std::uint64_t capacity = check_plannable(profile, budget_bytes);
  detail::refuse_grouped_ops(profile);
  std::vector<Choice> choices(profile.regions.size(), Choice::recompute);
  const std::vector<OpGroup> groups = detail::op_groups(profile, capacity, choices);
  OpSolver solver(profile, groups, capacity);
  bool exact = true;
  double bound = 0;
  const OpSolver::Choice chosen = solver.solve(exact, bound);
  std::vector<std::vector<OpCost>> kept = detail::kept_ops_of(profile, groups, chosen, choices);
  Plan plan = detail::op_plan_of(profile, choices, std::move(kept));
  plan.budget_bytes = budget_bytes;
  plan.exact = exact;
  plan.least_recompute_seconds =
      exact ? plan.recompute_seconds : std::max(0.0, plan.recompute_seconds - (bound - chosen.value));
  return plan;
}

namespace detail {

struct PricedOpPlans::Solver {
  explicit Solver(const RegionProfile& profile)
      : choices(profile.regions.size(), Choice::recompute),
        groups(op_groups(profile, std::numeric_limits<std::uint64_t>::max(), choices)),
        solver(profile, groups, std::numeric_limits<std::uint64_t>::max()) {}

  std::vector<Choice> choices;  // of the regions without a choice to make
  std::vector<OpGroup> groups;
  OpSolver solver;
};

PricedOpPlans::PricedOpPlans(const RegionProfile& profile) : profile_(profile) {
  refuse_grouped_ops(profile);
  solver_ = std::make_unique<Solver>(profile);
}

PricedOpPlans::~PricedOpPlans() = default;

std::pair<double, double> PricedOpPlans::price_range() const { return solver_->solver.price_range(); }

OpChoices PricedOpPlans::at(double per_byte) const {
  const OpSolver::Choice chosen = solver_->solver.at_price(per_byte);
  OpChoices plan{solver_->choices, KeptOps(profile_.regions.size())};
  for (std::size_t k = 0; k < solver_->groups.size(); ++k) {
    const std::size_t r = solver_->groups[k].region;
    if (chosen.mode[k] == OpMode::save) plan.choices[r] = Choice::save;
    if (chosen.mode[k] != OpMode::ops) continue;
    for (const std::size_t o : chosen.kept[k]) plan.kept[r].push_back(profile_.regions[r].ops[o].index);
  }
  return plan;
}

const OpCost& op_at(const RegionCost& region, std::uint32_t index) {
  // Ops are listed by index, usually all of them: the op with index i is at position i.
  if (index < region.ops.size() && region.ops[index].index == index) return region.ops[index];
  return *std::find_if(region.ops.begin(), region.ops.end(), [&](const OpCost& op) { return op.index == index; });
}

Plan op_plan_of(const RegionProfile& profile, const std::vector<Choice>& choices,
                std::vector<std::vector<OpCost>> kept) {
  Plan plan;
  plan.base_bytes = profile.base_bytes;
  plan.kept_ops = std::move(kept);
  plan.kept_bytes = profile.base_bytes;
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    RegionCost region = profile.regions[r];
    if (choices[r] == Choice::save) {
      plan.kept_bytes += region.saved_bytes;
    } else {
      plan.recompute_seconds += keeping_seconds(region, plan.kept_ops[r]);
      for (const OpCost& op : plan.kept_ops[r]) plan.kept_bytes += op.bytes;
    }
    region.ops.clear();  // the plan lists the ops it keeps, not every op the profile measured
    if (plan.kept_ops[r].empty()) region.op_overhead_seconds = 0;
    plan.regions.emplace_back(std::move(region), choices[r]);
  }
  if (std::all_of(plan.kept_ops.begin(), plan.kept_ops.end(), [](const auto& ops) { return ops.empty(); })) {
    plan.kept_ops.clear();
  }
  return plan;
}

}  // namespace detail

}  // namespace remat::budget
