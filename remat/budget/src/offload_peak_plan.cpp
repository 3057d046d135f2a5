// Plans by step peak with offload (offload_plan.hpp): each region saved, recomputed or offloaded,
// so that the predicted step peak (step_model.hpp, which follows the offloader's prefetch) fits a
// peak budget, the offloaded regions' bytes fit a host budget, and the step spends the least time.
// The search is peak_plan_search.hpp's, seeded with every region saved, every region recomputed,
// the plans by kept bytes without offload (solve's) and with it (solve_offload's relaxation) at
// budgets across the range, and the plan by step peak without offload (solve_peak's): a plan with
// offload is never slower than the one without. Where its walk ends the plan is proved.

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "offload_plan_of.hpp"
#include "peak_plan_search.hpp"
#include "step_model.hpp"
#include "unproved_choices.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace remat::budget {

namespace {

constexpr std::size_t kKeptBudgetsTried = 32;

// Seeds the search with the plans other solvers make: every region saved, every region
// recomputed, the plans by kept bytes without offload and with it (solve_offload's without its
// search), across the kept range.
void seed_from_other_solvers(detail::PeakPlanSearch& search, const RegionProfile& profile, std::uint64_t host_budget) {
  const std::size_t n = profile.regions.size();
  search.seed(std::vector<Choice>(n, Choice::save));
  search.seed(std::vector<Choice>(n, Choice::recompute));
  const std::uint64_t least = least_kept_bytes(profile), most = profile.all_saved_bytes();
  const auto budget = [&](std::size_t step, std::size_t steps) { return least + (most - least) / (steps - 1) * step; };
  for (std::size_t step = 0; step < kKeptBudgetsTried; ++step) {
    search.seed(choices_of(solve(profile, budget(step, kKeptBudgetsTried))));
  }
  for (std::size_t step = 0; step < kKeptBudgetsTried && host_budget > 0; ++step) {
    const auto [choices, offloaded] =
        detail::unproved_offload_choices(profile, budget(step, kKeptBudgetsTried), host_budget);
    search.seed(choices, offloaded);
  }
}

// What both searches ask of the profile: no groups where there is a host budget (the step model
// brings an offloaded region's bytes back by checkpoint call, from the profile's figure for the
// region, and a group's figure is its regions' added up), its step (returned), seconds that add up,
// copy figures and offload bytes that add up where there is a host budget.
const StepMemory& check_peak_offload(const RegionProfile& profile, std::uint64_t host_budget_bytes) {
  for (const RegionCost& region : profile.regions) {
    if (host_budget_bytes == 0 || region.count <= 1) continue;
    throw BudgetError("region '" + region.name + "' stands for " + std::to_string(region.count) +
                      " regions (a grouped profile); plans by step peak with a host budget plan regions as measured: "
                      "plan the profile before grouping, or by kept bytes (solve_offload), which groups");
  }
  const StepMemory& step = detail::step_of(profile);
  check_seconds_add_up(profile);
  detail::check_offloadable(profile, host_budget_bytes);
  return step;
}

}  // namespace

Plan solve_peak_offload(const RegionProfile& profile, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes) {
  const StepMemory& step = check_peak_offload(profile, host_budget_bytes);
  detail::PeakPlanSearch search(profile, detail::PeakGoal::fastest, peak_bytes, host_budget_bytes);
  seed_from_other_solvers(search, profile, host_budget_bytes);
  // The plan without offload, where one fits: the plan with offload is never slower. (Where none
  // fits, the seeds stay those of least_step_peak_offload, which the moves follow.)
  try {
    search.seed(choices_of(solve_peak(profile, peak_bytes)));
  } catch (const BudgetError&) {
  }
  search.move();
  const bool exact = search.walk();
  if (!search.found()) {
    const std::uint64_t least = std::min(search.lowest_peak(), least_step_peak(profile));
    detail::refuse_peak(step, peak_bytes, least,
                        std::string(exact ? "" : " among the plans tried") + " with a host budget of " +
                            std::to_string(host_budget_bytes) + " bytes");
  }
  const detail::PeakCandidate& best = search.best();
  Plan plan = detail::offload_plan_of(profile, best.choices, best.offloaded, search.copy_seconds(), host_budget_bytes);
  detail::finish_peak_plan(plan, exact, peak_bytes, best.peak);
  return plan;
}

std::uint64_t least_step_peak_offload(const RegionProfile& profile, std::uint64_t host_budget_bytes) {
  (void)check_peak_offload(profile, host_budget_bytes);
  detail::PeakPlanSearch search(profile, detail::PeakGoal::least_peak, 0, host_budget_bytes);
  seed_from_other_solvers(search, profile, host_budget_bytes);
  search.move();
  search.walk();
  // solve_peak_offload weighs the plan by step peak without offload too: the least it can reach.
  return std::min(search.lowest_peak(), least_step_peak(profile));
}

}  // namespace remat::budget
