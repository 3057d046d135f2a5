// Per-op plans by step peak (op_plan.hpp): each region saved, recomputed, or recomputed keeping
// some of its ops' outputs, so that the predicted step peak (step_model.hpp, which counts what the
// kept ops made from their forward to their call's backward) fits a peak budget and the step
// spends the least time.
//
// The peak is no sum over regions, so no knapsack bound holds for it. Where a profile allows few
// plans, every one is weighed, which proves the plan. Beyond, the plans weighed come from the other
// solvers: the plan by regions alone (solve_peak), the fastest per-op plan with no limit
// (solve_ops), per-op plans at a price per byte kept (PricedOpPlans), whose peak falls as the
// price rises though not strictly, at prices bisected (geometrically: they span orders of
// magnitude) between one that keeps every option worth keeping and one that keeps none, and on a
// profile with few ops, solve_ops's plans at bisected budgets of kept bytes. The fastest of them
// within the peak stands, marked not exact, unless it is the fastest plan with no limit at all
// (then nothing can beat it).

#include <remat/budget/op_plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "op_plan_of.hpp"
#include "step_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace remat::budget {

namespace {

constexpr std::uint64_t kEveryPlanUpTo = std::uint64_t{1} << 16;
constexpr int kPriceBisections = 20;
// Where a profile has at most this many ops a plan may keep, solve_ops's plans at budgets bisected
// between the least the checkpoints keep and all they could keep are weighed too: better than the
// priced plans where few regions make the price plans far apart, and affordable there (10 exact
// searches of 4096 ops take tenths of a second).
constexpr std::size_t kBudgetBisectionsUpTo = 4096;
constexpr int kBudgetBisections = 10;

// One way to run a region: save it, or recompute it keeping `kept` (op indexes; none: recompute).
struct Option {
  Choice choice = Choice::recompute;
  std::vector<std::uint32_t> kept;
};

// The ops of a region a plan may keep, as solve_ops weighs them (some bytes, some seconds); none
// where a must_save or must_recompute reason leaves the region one option.
std::vector<std::uint32_t> usable_ops(const RegionCost& region) {
  std::vector<std::uint32_t> usable;
  if (!region.must_save.empty() || !region.must_recompute.empty()) return usable;
  for (const OpCost& op : region.ops) {
    if (op.bytes > 0 && op.seconds > 0) usable.push_back(op.index);
  }
  return usable;
}

std::size_t usable_op_count(const RegionProfile& profile) {
  std::size_t count = 0;
  for (const RegionCost& region : profile.regions) count += usable_ops(region).size();
  return count;
}

// Every option of a region: the one a must_save or must_recompute reason leaves, else save,
// recompute, and recompute keeping each non-empty subset of `usable` (fewer than 16 ops).
std::vector<Option> options_of(const RegionCost& region, const std::vector<std::uint32_t>& usable) {
  if (!region.must_save.empty()) return {{Choice::save, {}}};
  if (!region.must_recompute.empty()) return {{Choice::recompute, {}}};
  std::vector<Option> options{{Choice::save, {}}, {Choice::recompute, {}}};
  for (std::uint32_t mask = 1; mask < (std::uint32_t{1} << usable.size()); ++mask) {
    Option keeping{Choice::recompute, {}};
    for (std::size_t o = 0; o < usable.size(); ++o) {
      if ((mask >> o) & 1) keeping.kept.push_back(usable[o]);
    }
    options.push_back(std::move(keeping));
  }
  return options;
}

class OpPeakSearch {
 public:
  OpPeakSearch(const RegionProfile& profile, std::uint64_t peak_bytes)
      : profile_(profile), model_(profile, detail::step_of(profile)), peak_bytes_(peak_bytes) {}

  // Weighs a plan; returns its predicted peak.
  std::uint64_t weigh(const std::vector<Choice>& choices, const KeptOps& kept) {
    double seconds = 0;
    for (std::size_t r = 0; r < choices.size(); ++r) {
      if (choices[r] != Choice::save) seconds += detail::keeping_seconds(profile_.regions[r], kept[r]);
    }
    const std::uint64_t peak = model_.peak(choices, {}, &kept);
    lowest_peak_ = std::min(lowest_peak_, peak);
    if (peak <= peak_bytes_ &&
        (!found_ || seconds < best_seconds_ || (seconds == best_seconds_ && peak < best_peak_))) {
      found_ = true;
      best_choices_ = choices;
      best_kept_ = kept;
      best_seconds_ = seconds;
      best_peak_ = peak;
    }
    return peak;
  }

  // Weighs a plan another solver made; returns its predicted peak.
  std::uint64_t weigh(const Plan& plan) { return weigh(choices_of(plan), kept_ops_of(plan)); }
  std::uint64_t weigh(const detail::OpChoices& plan) { return weigh(plan.choices, plan.kept); }

  // Weighs every plan where there are at most kEveryPlanUpTo; false (nothing weighed) where more.
  bool weigh_every_plan() {
    std::vector<std::vector<Option>> options;
    std::uint64_t plans = 1;
    for (const RegionCost& region : profile_.regions) {
      const std::vector<std::uint32_t> usable = usable_ops(region);
      if (usable.size() >= 16) return false;
      options.push_back(options_of(region, usable));
      plans *= options.back().size();
      if (plans > kEveryPlanUpTo) return false;
    }
    const std::size_t n = options.size();
    std::vector<std::size_t> at(n, 0);
    std::vector<Choice> choices(n);
    KeptOps kept(n);
    while (true) {
      for (std::size_t r = 0; r < n; ++r) {
        choices[r] = options[r][at[r]].choice;
        kept[r] = options[r][at[r]].kept;
      }
      weigh(choices, kept);
      std::size_t r = 0;
      for (; r < n && ++at[r] == options[r].size(); ++r) at[r] = 0;
      if (r == n) return true;
    }
  }

  bool found() const { return found_; }
  std::uint64_t lowest_peak() const { return lowest_peak_; }
  double best_seconds() const { return best_seconds_; }

  Plan best_plan() const {
    std::vector<std::vector<OpCost>> kept(profile_.regions.size());
    for (std::size_t r = 0; r < kept.size(); ++r) {
      for (const std::uint32_t index : best_kept_[r]) kept[r].push_back(detail::op_at(profile_.regions[r], index));
    }
    return detail::op_plan_of(profile_, best_choices_, std::move(kept));
  }
  std::uint64_t best_peak() const { return best_peak_; }

 private:
  const RegionProfile& profile_;
  detail::StepModel model_;
  std::uint64_t peak_bytes_;
  bool found_ = false;
  std::vector<Choice> best_choices_;
  KeptOps best_kept_;
  double best_seconds_ = std::numeric_limits<double>::infinity();
  std::uint64_t best_peak_ = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t lowest_peak_ = std::numeric_limits<std::uint64_t>::max();
};

// The step must say which storages each op a plan may keep made, in every call of its region.
void check_step_lists_ops(const RegionProfile& profile) {
  const StepMemory& step = detail::step_of(profile);
  const std::vector<std::vector<std::size_t>> indexes = detail::region_indexes(profile, step);
  for (std::size_t k = 0; k < step.checkpoints.size(); ++k) {
    for (std::size_t r = 0; r < step.checkpoints[k].regions.size(); ++r) {
      const StepRegion& listed = step.checkpoints[k].regions[r];
      for (const OpCost& op : profile.regions[indexes[k][r]].ops) {
        const bool found = std::any_of(listed.ops.begin(), listed.ops.end(),
                                       [&](const StepOp& step_op) { return step_op.index == op.index; });
        if (found) continue;
        throw BudgetError("the profile's step does not list op " + std::to_string(op.index) + " (" + op.op +
                          ") of region '" + listed.name + "' in checkpoint call " + std::to_string(k) +
                          ", so what keeping it holds through the step is unknown: profile the step with "
                          "remat.profile_regions(ops=True) and its tensors counted (an older profile has per-op "
                          "figures without them), or plan by budget_bytes with ops");
      }
    }
  }
}

}  // namespace

Plan solve_peak_ops(const RegionProfile& profile, std::uint64_t peak_bytes) {
  const StepMemory& step = detail::step_of(profile);
  check_seconds_add_up(profile);
  detail::refuse_grouped_ops(profile);
  check_step_lists_ops(profile);
  OpPeakSearch search(profile, peak_bytes);
  bool exact = search.weigh_every_plan();
  if (!exact) {
    search.weigh(solve_peak(profile, peak_bytes));  // names the least peak where no plan by regions fits
    std::uint64_t most = profile.all_saved_bytes();
    for (const RegionCost& region : profile.regions) {
      for (const OpCost& op : region.ops) most += std::min(op.bytes, UINT64_MAX - most);
    }
    // The fastest plan with no limit: where it fits, no plan is faster.
    const Plan unlimited = solve_ops(profile, most);
    exact = search.weigh(unlimited) <= peak_bytes && search.best_seconds() == unlimited.recompute_seconds &&
            unlimited.exact;
    if (!exact) {
      const detail::PricedOpPlans priced(profile);
      auto [over, fits] = priced.price_range();
      for (int i = 0; i < kPriceBisections && over > 0 && fits > over * (1 + 1e-12); ++i) {
        const double mid = std::sqrt(over * fits);
        (search.weigh(priced.at(mid)) <= peak_bytes ? fits : over) = mid;
      }
    }
    if (!exact && usable_op_count(profile) <= kBudgetBisectionsUpTo) {
      std::uint64_t fits = least_kept_bytes(profile), over = most;
      for (int i = 0; i < kBudgetBisections && over - fits > 1; ++i) {
        const std::uint64_t mid = fits + (over - fits) / 2;
        (search.weigh(solve_ops(profile, mid)) <= peak_bytes ? fits : over) = mid;
      }
    }
  }
  if (!search.found()) detail::refuse_peak(step, peak_bytes, search.lowest_peak(), "");
  Plan plan = search.best_plan();
  detail::finish_peak_plan(plan, exact, peak_bytes, search.best_peak());
  return plan;
}

}  // namespace remat::budget
