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
//
// With a host budget (solve_peak_ops_offload), offload is one more option of each region that can
// be offloaded, both in every plan weighed and among the other solvers' plans (solve_peak_offload's
// in place of solve_peak's, solve_ops_offload's in place of solve_ops's).

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/op_plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "offload_plan_of.hpp"
#include "op_plan_of.hpp"
#include "step_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
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

// One way to run a region: save it (and offload it), or recompute it keeping `kept` (op indexes;
// none: recompute).
struct Option {
  Choice choice = Choice::recompute;
  std::vector<std::uint32_t> kept;
  bool offload = false;
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
// recompute, offload where `offloadable`, and recompute keeping each non-empty subset of `usable`
// (fewer than 16 ops).
std::vector<Option> options_of(const RegionCost& region, const std::vector<std::uint32_t>& usable, bool offloadable) {
  if (!region.must_save.empty()) return {{Choice::save, {}}};
  if (!region.must_recompute.empty()) return {{Choice::recompute, {}}};
  std::vector<Option> options{{Choice::save, {}}, {Choice::recompute, {}}};
  if (offloadable) options.push_back({Choice::save, {}, true});
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
  // host_budget: plans may offload that much (none: plans without offload).
  OpPeakSearch(const RegionProfile& profile, std::uint64_t peak_bytes, std::optional<std::uint64_t> host_budget)
      : profile_(profile),
        model_(profile, detail::step_of(profile)),
        peak_bytes_(peak_bytes),
        host_budget_(host_budget),
        copy_seconds_(profile.regions.size(), 0),
        offloadable_(profile.regions.size(), false) {
    for (std::size_t r = 0; r < profile.regions.size() && host_budget.value_or(0) > 0; ++r) {
      const RegionCost& region = profile.regions[r];
      if (!detail::offloadable_within(region, *host_budget)) continue;
      offloadable_[r] = true;
      copy_seconds_[r] = offload_seconds(profile, region);
    }
  }

  // Weighs a plan (`offloaded`: empty, or one per region); returns its predicted peak, or none where
  // it offloads more than the host budget.
  std::optional<std::uint64_t> weigh(const std::vector<Choice>& choices, const KeptOps& kept,
                                     const std::vector<bool>& offloaded = {}) {
    double seconds = 0;
    std::uint64_t host = 0;
    for (std::size_t r = 0; r < choices.size(); ++r) {
      if (!offloaded.empty() && offloaded[r]) {
        if (!offloadable_[r]) return std::nullopt;
        seconds += copy_seconds_[r];
        host += profile_.regions[r].offload_bytes;
      } else if (choices[r] != Choice::save) {
        seconds += detail::keeping_seconds(profile_.regions[r], kept[r]);
      }
    }
    if (host > host_budget_.value_or(0)) return std::nullopt;
    const std::uint64_t peak = model_.peak(choices, offloaded, &kept);
    lowest_peak_ = std::min(lowest_peak_, peak);
    if (peak <= peak_bytes_ &&
        (!found_ || seconds < best_seconds_ || (seconds == best_seconds_ && peak < best_peak_))) {
      found_ = true;
      best_choices_ = choices;
      best_kept_ = kept;
      best_offloaded_ = offloaded.empty() ? std::vector<bool>(choices.size(), false) : offloaded;
      best_seconds_ = seconds;
      best_peak_ = peak;
    }
    return peak;
  }

  // Weighs a plan another solver made: whether its predicted peak fits.
  bool fits(const Plan& plan) { return fits(weigh(choices_of(plan), kept_ops_of(plan), plan.offloaded)); }
  bool fits(const detail::OpChoices& plan) { return fits(weigh(plan.choices, plan.kept)); }

  // Weighs every plan where there are at most kEveryPlanUpTo; false (nothing weighed) where more.
  bool weigh_every_plan() {
    std::vector<std::vector<Option>> options;
    std::uint64_t plans = 1;
    for (const RegionCost& region : profile_.regions) {
      const std::vector<std::uint32_t> usable = usable_ops(region);
      if (usable.size() >= 16) return false;
      options.push_back(options_of(region, usable, offloadable_[options.size()]));
      plans *= options.back().size();
      if (plans > kEveryPlanUpTo) return false;
    }
    const std::size_t n = options.size();
    std::vector<std::size_t> at(n, 0);
    std::vector<Choice> choices(n);
    KeptOps kept(n);
    std::vector<bool> offloaded(n, false);
    while (true) {
      for (std::size_t r = 0; r < n; ++r) {
        choices[r] = options[r][at[r]].choice;
        kept[r] = options[r][at[r]].kept;
        offloaded[r] = options[r][at[r]].offload;
      }
      weigh(choices, kept, offloaded);
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
    if (!host_budget_) return detail::op_plan_of(profile_, best_choices_, std::move(kept));
    return detail::op_offload_plan_of(profile_, best_choices_, std::move(kept), best_offloaded_, copy_seconds_,
                                      *host_budget_);
  }
  std::uint64_t best_peak() const { return best_peak_; }

 private:
  bool fits(std::optional<std::uint64_t> peak) const { return peak && *peak <= peak_bytes_; }

  const RegionProfile& profile_;
  detail::StepModel model_;
  std::uint64_t peak_bytes_;
  std::optional<std::uint64_t> host_budget_;
  std::vector<double> copy_seconds_;  // per region, where it is offloadable
  std::vector<bool> offloadable_;
  bool found_ = false;
  std::vector<Choice> best_choices_;
  KeptOps best_kept_;
  std::vector<bool> best_offloaded_;
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

namespace {

Plan solve_peak_ops(const RegionProfile& profile, std::uint64_t peak_bytes, std::optional<std::uint64_t> host_budget) {
  const StepMemory& step = detail::step_of(profile);
  check_seconds_add_up(profile);
  detail::refuse_grouped_ops(profile);
  check_step_lists_ops(profile);
  detail::check_offloadable(profile, host_budget.value_or(0));
  const std::uint64_t host = host_budget.value_or(0);
  // The per-op plan by kept bytes, with offload where there is a host budget.
  const auto by_kept = [&](std::uint64_t budget) {
    return host_budget ? solve_ops_offload(profile, budget, host) : solve_ops(profile, budget);
  };
  OpPeakSearch search(profile, peak_bytes, host_budget);
  std::optional<BudgetError> by_regions_refused;
  bool exact = search.weigh_every_plan();
  if (!exact) {
    // Each names the least peak where no plan by regions fits. The search with offload may stop at its
    // limit short of a plan that fits where another solver's plan does: its refusal then waits.
    try {
      search.fits(host_budget ? solve_peak_offload(profile, peak_bytes, host) : solve_peak(profile, peak_bytes));
    } catch (const BudgetError& error) {
      if (!host_budget) throw;
      by_regions_refused = error;
    }
    std::uint64_t most = profile.all_saved_bytes();
    for (const RegionCost& region : profile.regions) {
      for (const OpCost& op : region.ops) most += std::min(op.bytes, UINT64_MAX - most);
    }
    // The fastest plan with no limit on the device: where it fits, no plan is faster.
    const Plan unlimited = by_kept(most);
    exact = search.fits(unlimited) && search.best_seconds() == unlimited.recompute_seconds && unlimited.exact;
    if (!exact) {
      const detail::PricedOpPlans priced(profile);
      auto [over, fits] = priced.price_range();
      for (int i = 0; i < kPriceBisections && over > 0 && fits > over * (1 + 1e-12); ++i) {
        const double mid = std::sqrt(over * fits);
        (search.fits(priced.at(mid)) ? fits : over) = mid;
      }
    }
    if (!exact && usable_op_count(profile) <= kBudgetBisectionsUpTo) {
      std::uint64_t fits = least_kept_bytes(profile), over = most;
      for (int i = 0; i < kBudgetBisections && over - fits > 1; ++i) {
        const std::uint64_t mid = fits + (over - fits) / 2;
        (search.fits(by_kept(mid)) ? fits : over) = mid;
      }
    }
  }
  if (!search.found()) {
    if (by_regions_refused) throw *by_regions_refused;
    detail::refuse_peak(step, peak_bytes, search.lowest_peak(),
                        host_budget ? " with a host budget of " + std::to_string(host) + " bytes" : "");
  }
  Plan plan = search.best_plan();
  detail::finish_peak_plan(plan, exact, peak_bytes, search.best_peak());
  return plan;
}

}  // namespace

Plan solve_peak_ops(const RegionProfile& profile, std::uint64_t peak_bytes) {
  return solve_peak_ops(profile, peak_bytes, std::nullopt);
}

Plan solve_peak_ops_offload(const RegionProfile& profile, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes) {
  return solve_peak_ops(profile, peak_bytes, host_budget_bytes);
}

}  // namespace remat::budget
