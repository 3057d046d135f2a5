// Plans by step peak with offload (offload_plan.hpp): each region saved, recomputed or offloaded,
// so that the predicted step peak (step_model.hpp, which follows the offloader's prefetch) fits a
// peak budget, the offloaded regions' bytes fit a host budget, and the step spends the least time.
//
// The peak is no sum over regions (an offloaded region's bytes come back in a backward that
// depends on which later call offloads too), so no knapsack bound holds; the search is a
// depth-first walk over every choice of every region, cheapest option first, pruned only where
// the time spent so far already passes the best plan found (times only add up) or the host bytes
// pass the host budget. Incumbents come first from the plans without offload (solve_peak's) and
// from offload plans by kept bytes (solve_offload) at budgets across the range, so the bound
// prunes from the start. A walk that ends within its limit of plans weighed proves the plan; one
// that does not leaves the best plan found, marked not exact.

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "offload_plan_of.hpp"
#include "step_model.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace remat::budget {

namespace {

// Plans weighed before the walk gives up on proving (each asks the step model once).
constexpr std::size_t kMostPlans = std::size_t{1} << 17;
constexpr std::size_t kKeptBudgetsTried = 32;

enum class Option : std::uint8_t { save, recompute, offload };

struct Candidate {
  std::vector<Choice> choices;
  std::vector<bool> offloaded;
  double seconds = std::numeric_limits<double>::infinity();
  std::uint64_t peak = 0;
  std::uint64_t host = 0;
};

class PeakOffloadSearch {
 public:
  PeakOffloadSearch(const RegionProfile& profile, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes)
      : profile_(profile),
        model_(profile, detail::step_of(profile)),
        peak_bytes_(peak_bytes),
        host_budget_(host_budget_bytes) {
    const std::size_t n = profile.regions.size();
    options_.resize(n);
    copy_seconds_.assign(n, 0);
    for (std::size_t r = 0; r < n; ++r) {
      const RegionCost& region = profile.regions[r];
      if (!region.must_recompute.empty()) {
        options_[r].push_back(Option::recompute);
        continue;
      }
      options_[r].push_back(Option::save);
      if (!region.must_save.empty()) continue;
      options_[r].push_back(Option::recompute);
      if (detail::offloadable_within(region, host_budget_bytes)) {
        copy_seconds_[r] = offload_seconds(profile, region);
        options_[r].push_back(Option::offload);
      }
      std::stable_sort(options_[r].begin(), options_[r].end(),
                       [&](Option a, Option b) { return cost(r, a) < cost(r, b); });
    }
    current_.choices.assign(n, Choice::save);
    current_.offloaded.assign(n, false);
  }

  // Weighs `choices` (a plan from elsewhere, within the host budget) as an incumbent.
  void seed(const std::vector<Choice>& choices, const std::vector<bool>& offloaded) {
    Candidate c;
    c.choices = choices;
    c.offloaded = offloaded;
    c.seconds = 0;
    for (std::size_t r = 0; r < choices.size(); ++r) {
      if (!profile_.regions[r].must_save.empty() && (choices[r] != Choice::save || offloaded[r])) return;
      if (!profile_.regions[r].must_recompute.empty() && choices[r] != Choice::recompute) return;
      const Option option = offloaded[r]                 ? Option::offload
                            : choices[r] == Choice::save ? Option::save
                                                         : Option::recompute;
      if (option == Option::offload && std::find(options_[r].begin(), options_[r].end(), option) == options_[r].end()) {
        return;
      }
      c.seconds += cost(r, option);
      c.host += offloaded[r] ? profile_.regions[r].offload_bytes : 0;
    }
    if (c.host > host_budget_) return;
    weigh(std::move(c));
  }

  // The walk; true where it ended (the best plan found is then the best there is).
  bool walk() {
    order_.resize(profile_.regions.size());
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    // Dearest regions first, so that the time bound bites near the root.
    std::stable_sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
      return profile_.regions[a].seconds > profile_.regions[b].seconds;
    });
    current_.seconds = 0;
    current_.host = 0;
    return visit(0);
  }

  const Candidate& best() const { return best_; }
  bool found() const { return best_.seconds < std::numeric_limits<double>::infinity(); }
  std::uint64_t lowest_peak() const { return lowest_peak_; }
  double copy_seconds(std::size_t r) const { return copy_seconds_[r]; }

 private:
  double cost(std::size_t r, Option option) const {
    if (option == Option::recompute) return profile_.regions[r].seconds;
    if (option == Option::offload) return copy_seconds_[r];
    return 0;
  }

  void weigh(Candidate c) {
    ++weighed_;
    c.peak = model_.peak(c.choices, c.offloaded);
    lowest_peak_ = std::min(lowest_peak_, c.peak);
    if (c.peak > peak_bytes_) return;
    if (c.seconds < best_.seconds || (c.seconds == best_.seconds && c.peak < best_.peak)) best_ = std::move(c);
  }

  bool visit(std::size_t i) {
    if (current_.seconds > best_.seconds) return true;
    if (i == order_.size()) {
      if (weighed_ >= kMostPlans) return false;
      weigh(current_);
      return true;
    }
    const std::size_t r = order_[i];
    for (const Option option : options_[r]) {
      const std::uint64_t host = option == Option::offload ? profile_.regions[r].offload_bytes : 0;
      if (host > host_budget_ - current_.host) continue;
      const double before = current_.seconds;
      current_.choices[r] = option == Option::recompute ? Choice::recompute : Choice::save;
      current_.offloaded[r] = option == Option::offload;
      current_.seconds += cost(r, option);
      current_.host += host;
      const bool ended = visit(i + 1);
      current_.seconds = before;
      current_.host -= host;
      current_.choices[r] = Choice::save;
      current_.offloaded[r] = false;
      if (!ended) return false;
    }
    return true;
  }

  const RegionProfile& profile_;
  detail::StepModel model_;
  std::uint64_t peak_bytes_, host_budget_;
  std::vector<std::vector<Option>> options_;
  std::vector<double> copy_seconds_;
  std::vector<std::size_t> order_;
  Candidate current_, best_;
  std::uint64_t lowest_peak_ = std::numeric_limits<std::uint64_t>::max();
  std::size_t weighed_ = 0;
};

// Seeds the search with the plans other solvers make: every region saved, every region
// recomputed, the plans by kept bytes without offload and with it across the kept range.
void seed_from_other_solvers(PeakOffloadSearch& search, const RegionProfile& profile, std::uint64_t host_budget) {
  const std::size_t n = profile.regions.size();
  const std::vector<bool> none(n, false);
  search.seed(std::vector<Choice>(n, Choice::save), none);
  search.seed(std::vector<Choice>(n, Choice::recompute), none);
  const std::uint64_t least = least_kept_bytes(profile), most = profile.all_saved_bytes();
  for (std::size_t step = 0; step < kKeptBudgetsTried; ++step) {
    const std::uint64_t budget = least + (most - least) / (kKeptBudgetsTried - 1) * step;
    for (const bool offload : {false, true}) {
      if (offload && host_budget == 0) continue;
      const Plan plan = offload ? solve_offload(profile, budget, host_budget) : solve(profile, budget);
      search.seed(choices_of(plan), plan.offloaded.empty() ? none : plan.offloaded);
    }
  }
}

// The step model brings an offloaded region's bytes back by checkpoint call, from the profile's
// figure for the region: a group's figure is its regions' added up.
void refuse_groups(const RegionProfile& profile, std::uint64_t host_budget_bytes) {
  if (host_budget_bytes == 0) return;
  for (const RegionCost& region : profile.regions) {
    if (region.count <= 1) continue;
    throw BudgetError("region '" + region.name + "' stands for " + std::to_string(region.count) +
                      " regions (a grouped profile); plans by step peak with a host budget plan regions as measured: "
                      "plan the profile before grouping, or by kept bytes (solve_offload), which groups");
  }
}

}  // namespace

Plan solve_peak_offload(const RegionProfile& profile, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes) {
  refuse_groups(profile, host_budget_bytes);
  const StepMemory& step = detail::step_of(profile);
  check_seconds_add_up(profile);
  if (host_budget_bytes > 0 && !profile.host_copy) (void)offload_seconds(profile, RegionCost{});
  PeakOffloadSearch search(profile, peak_bytes, host_budget_bytes);
  seed_from_other_solvers(search, profile, host_budget_bytes);
  const bool exact = search.walk();
  if (!search.found()) {
    detail::refuse_peak(step, peak_bytes, search.lowest_peak(),
                        std::string(exact ? "" : " among the plans tried") + " with a host budget of " +
                            std::to_string(host_budget_bytes) + " bytes");
  }
  const Candidate& best = search.best();
  std::vector<double> copy_seconds(profile.regions.size());
  for (std::size_t r = 0; r < copy_seconds.size(); ++r) copy_seconds[r] = search.copy_seconds(r);
  Plan plan = detail::offload_plan_of(profile, best.choices, best.offloaded, copy_seconds, host_budget_bytes);
  detail::finish_peak_plan(plan, exact, peak_bytes, best.peak);
  return plan;
}

std::uint64_t least_step_peak_offload(const RegionProfile& profile, std::uint64_t host_budget_bytes) {
  refuse_groups(profile, host_budget_bytes);
  (void)detail::step_of(profile);
  check_seconds_add_up(profile);
  if (host_budget_bytes > 0 && !profile.host_copy) (void)offload_seconds(profile, RegionCost{});
  PeakOffloadSearch search(profile, 0, host_budget_bytes);
  seed_from_other_solvers(search, profile, host_budget_bytes);
  search.walk();
  return search.lowest_peak();
}

}  // namespace remat::budget
