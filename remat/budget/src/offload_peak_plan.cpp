// Plans by step peak with offload (offload_plan.hpp): each region saved, recomputed or offloaded,
// so that the predicted step peak (step_model.hpp, which follows the offloader's prefetch) fits a
// peak budget, the offloaded regions' bytes fit a host budget, and the step spends the least time.
//
// The peak is no sum over regions (an offloaded region's bytes come back in a backward that
// depends on which later call offloads too), so no knapsack bound holds. The search has three
// steps, each starting from what the one before found:
// - incumbents: the plans without offload (solve's) and offload plans by kept bytes
//   (solve_offload's) at budgets across the range, every region saved, every region recomputed;
// - moves: from the fastest few incumbents within the peak, one region's option changed, or two
//   regions' at once (one cheaper, the other dearer but smaller on the device), the first move
//   that fits and is faster taken, until none is;
// - a depth-first walk over every choice of every region, cheapest option first, pruned where
//   the time spent so far reaches the best plan's (times only add up) or the host bytes pass the
//   host budget. A walk that ends within its limit proves the plan; one that does not leaves the
//   best plan found, marked not exact.
// The least peak (least_step_peak_offload) is searched the same way, moves lowering the peak.
// Each step's limit is in plans weighed times the step model's size, which is what asking the
// model once costs, so that a large model's plan takes about as long as a small one's.

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "offload_plan_of.hpp"
#include "step_model.hpp"
#include "unproved_choices.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace remat::budget {

namespace {

// Limits on the plans weighed, times the step model's size (step_size below).
constexpr std::size_t kMovesWork = std::size_t{1} << 22;
constexpr std::size_t kWalkWork = std::size_t{1} << 22;
constexpr std::size_t kKeptBudgetsTried = 32;
constexpr std::size_t kMoveStarts = 4;

enum class Option : std::uint8_t { save, recompute, offload };

// What the search looks for: the fastest plan within the peak budget, or the least peak.
enum class Goal : std::uint8_t { fastest, least_peak };

struct Candidate {
  std::vector<Choice> choices;
  std::vector<bool> offloaded;
  double seconds = std::numeric_limits<double>::infinity();
  std::uint64_t peak = 0;
  std::uint64_t host = 0;

  bool same_plan(const Candidate& other) const { return choices == other.choices && offloaded == other.offloaded; }
};

std::size_t step_size(const RegionProfile& profile) {
  const StepMemory& step = detail::step_of(profile);
  return 1 + profile.regions.size() + step.segments.size() + step.storages.size();
}

class PeakOffloadSearch {
 public:
  PeakOffloadSearch(const RegionProfile& profile, Goal goal, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes)
      : profile_(profile),
        model_(profile, detail::step_of(profile)),
        goal_(goal),
        peak_bytes_(goal == Goal::least_peak ? 0 : peak_bytes),
        host_budget_(host_budget_bytes),
        most_moves_(kMovesWork / step_size(profile)),
        most_walked_(kWalkWork / step_size(profile)) {
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
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    // Dearest regions first, so that the time bound bites near the root.
    std::stable_sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
      return profile.regions[a].seconds > profile.regions[b].seconds;
    });
  }

  // Weighs `choices` (a plan from elsewhere, within the host budget) as an incumbent, and as a
  // start for the moves.
  void seed(const std::vector<Choice>& choices, const std::vector<bool>& offloaded) {
    Candidate c;
    c.choices = choices;
    c.offloaded = offloaded;
    c.seconds = 0;
    for (std::size_t r = 0; r < choices.size(); ++r) {
      const Option option = option_of(c, r);  // one the region may take (its pins, the host budget)?
      if (std::find(options_[r].begin(), options_[r].end(), option) == options_[r].end()) return;
      c.seconds += cost(r, option);
      c.host += offloaded[r] ? profile_.regions[r].offload_bytes : 0;
    }
    if (c.host > host_budget_) return;
    for (const Candidate& seeded : seeds_) {
      if (seeded.same_plan(c)) return;
    }
    weigh(c);
    seeds_.push_back(std::move(c));
  }

  // The moves. Where no incumbent fits the peak budget, they first lower the peak as the least
  // peak's search does (the same starts, the same moves, in the same order) until a plan fits, so
  // that a plan is found at any budget least_step_peak_offload names; then they look for faster
  // plans within it.
  void move() {
    if (goal_ == Goal::fastest && !found()) {
      goal_ = Goal::least_peak;
      move_from_starts();
      goal_ = Goal::fastest;
    }
    move_from_starts();
  }

  // The walk; true where it ended (the best plan found is then the best there is).
  bool walk() {
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

  static Option option_of(const Candidate& c, std::size_t r) {
    if (c.offloaded[r]) return Option::offload;
    return c.choices[r] == Choice::save ? Option::save : Option::recompute;
  }

  // Runs region r of `c` as `option`, its time and host bytes following.
  void set(Candidate& c, std::size_t r, Option option) const {
    const Option before = option_of(c, r);
    c.seconds += cost(r, option) - cost(r, before);
    if (before == Option::offload) c.host -= profile_.regions[r].offload_bytes;
    if (option == Option::offload) c.host += profile_.regions[r].offload_bytes;
    c.choices[r] = option == Option::recompute ? Choice::recompute : Choice::save;
    c.offloaded[r] = option == Option::offload;
  }

  // Sets c.peak, and takes c as the best plan where it is.
  void weigh(Candidate& c) {
    c.peak = model_.peak(c.choices, c.offloaded);
    lowest_peak_ = std::min(lowest_peak_, c.peak);
    if (c.peak > peak_bytes_) return;
    if (c.seconds < best_.seconds || (c.seconds == best_.seconds && c.peak < best_.peak)) best_ = c;
  }

  // Whether `to` is a better plan than `from` (which is within the peak, for the fastest).
  bool better(const Candidate& to, const Candidate& from) const {
    if (goal_ == Goal::least_peak) return to.peak < from.peak;
    return to.peak <= peak_bytes_ && (to.seconds < from.seconds || (to.seconds == from.seconds && to.peak < from.peak));
  }

  // The best kMoveStarts plans to move from: the seeds (and the best plan found) within the peak,
  // fastest first; for the least peak, the seeds lowest first. First-better moves from each, then
  // best moves from each.
  void move_from_starts() {
    std::vector<const Candidate*> starts;
    for (const Candidate& c : seeds_) {
      if (goal_ == Goal::least_peak || c.peak <= peak_bytes_) starts.push_back(&c);
    }
    const Candidate best = best_;
    if (goal_ == Goal::fastest && found()) starts.push_back(&best);
    std::stable_sort(starts.begin(), starts.end(), [&](const Candidate* a, const Candidate* b) {
      if (goal_ == Goal::least_peak) return a->peak < b->peak;
      return a->seconds < b->seconds || (a->seconds == b->seconds && a->peak < b->peak);
    });
    starts.erase(std::unique(starts.begin(), starts.end(),
                             [](const Candidate* a, const Candidate* b) { return a->same_plan(*b); }),
                 starts.end());
    starts.resize(std::min(starts.size(), kMoveStarts));
    for (const bool first : {true, false}) {
      for (const Candidate* start : starts) move_from(*start, first);
    }
  }

  // Where the least peak's moves stop: where a plan fits the budget (lowering the peak to find
  // one for the fastest, or a step peak of 0).
  bool lowered_enough() const { return goal_ == Goal::least_peak && found(); }

  // Region r to `a` and (where q is not r) region q to `b`, weighed where the move could be better
  // (faster, within the host budget); taken as `next` where it is better than `at` and than `next`.
  void try_move(const Candidate& at, std::size_t r, Option a, std::size_t q, Option b, Candidate& next) {
    Candidate to = at;
    set(to, r, a);
    if (q != r) set(to, q, b);
    if (to.host > host_budget_ || (goal_ == Goal::fastest && to.seconds >= at.seconds)) return;
    ++moves_;
    weigh(to);
    if (better(to, at) && (next.choices.empty() || better(to, next))) next = std::move(to);
  }

  // Moves from `at` (one region's option changed, or two regions'; for the fastest plan, the first
  // of them cheaper), taken until none is better or the moves' limit is reached: the first better
  // move found where `first`, else the best of every move.
  void move_from(Candidate at, bool first) {
    for (;;) {
      Candidate next;
      const auto done = [&] { return moves_ >= most_moves_ || (first && !next.choices.empty()) || lowered_enough(); };
      for (std::size_t i = 0; i < order_.size() && !done(); ++i) {
        const std::size_t r = order_[i];
        const Option now = option_of(at, r);
        for (const Option a : options_[r]) {
          if (done()) break;
          if (a == now || (goal_ == Goal::fastest && cost(r, a) >= cost(r, now))) continue;
          try_move(at, r, a, r, a, next);
          // For the least peak a pair is the same move either way round: each once.
          for (std::size_t j = goal_ == Goal::least_peak ? i + 1 : 0; j < order_.size(); ++j) {
            const std::size_t q = order_[j];
            for (const Option b : options_[q]) {
              if (q != r && b != option_of(at, q) && !done()) try_move(at, r, a, q, b, next);
            }
          }
        }
      }
      if (next.choices.empty()) return;
      at = std::move(next);
    }
  }

  bool visit(std::size_t i) {
    if (current_.seconds >= best_.seconds) return true;
    if (i == order_.size()) {
      if (walked_ >= most_walked_) return false;
      ++walked_;
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
  Goal goal_;
  std::uint64_t peak_bytes_, host_budget_;
  std::size_t most_moves_, most_walked_;
  std::vector<std::vector<Option>> options_;
  std::vector<double> copy_seconds_;
  std::vector<std::size_t> order_;
  std::vector<Candidate> seeds_;
  Candidate current_, best_;
  std::uint64_t lowest_peak_ = std::numeric_limits<std::uint64_t>::max();
  std::size_t moves_ = 0, walked_ = 0;
};

// Seeds the search with the plans other solvers make: every region saved, every region
// recomputed, the plans by kept bytes without offload and with it (solve_offload's without its
// search), across the kept range.
void seed_from_other_solvers(PeakOffloadSearch& search, const RegionProfile& profile, std::uint64_t host_budget) {
  const std::size_t n = profile.regions.size();
  const std::vector<bool> none(n, false);
  search.seed(std::vector<Choice>(n, Choice::save), none);
  search.seed(std::vector<Choice>(n, Choice::recompute), none);
  const std::uint64_t least = least_kept_bytes(profile), most = profile.all_saved_bytes();
  const auto budget = [&](std::size_t step, std::size_t steps) { return least + (most - least) / (steps - 1) * step; };
  for (std::size_t step = 0; step < kKeptBudgetsTried; ++step) {
    search.seed(choices_of(solve(profile, budget(step, kKeptBudgetsTried))), none);
  }
  for (std::size_t step = 0; step < kKeptBudgetsTried && host_budget > 0; ++step) {
    const auto [choices, offloaded] =
        detail::unproved_offload_choices(profile, budget(step, kKeptBudgetsTried), host_budget);
    search.seed(choices, offloaded);
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
  PeakOffloadSearch search(profile, Goal::fastest, peak_bytes, host_budget_bytes);
  seed_from_other_solvers(search, profile, host_budget_bytes);
  // The plan without offload, where one fits: the plan with offload is never slower. (Where none
  // fits, the seeds stay those of least_step_peak_offload, which the moves follow.)
  try {
    search.seed(choices_of(solve_peak(profile, peak_bytes)), std::vector<bool>(profile.regions.size(), false));
  } catch (const BudgetError&) {
  }
  search.move();
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
  PeakOffloadSearch search(profile, Goal::least_peak, 0, host_budget_bytes);
  seed_from_other_solvers(search, profile, host_budget_bytes);
  search.move();
  search.walk();
  return search.lowest_peak();
}

}  // namespace remat::budget
