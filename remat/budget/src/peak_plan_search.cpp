// The search by step peak over each region's options (peak_plan_search.hpp).

#include "peak_plan_search.hpp"

#include <remat/budget/offload_plan.hpp>

#include "offload_plan_of.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace remat::budget::detail {

namespace {

// Limits on the plans weighed, times the step model's size (step_size below); the walk weighs
// every plan where there are at most kWalkEveryPlanUpTo, whatever the size.
constexpr std::size_t kMovesWork = std::size_t{1} << 22;
constexpr std::size_t kWalkWork = std::size_t{1} << 21;
constexpr std::size_t kWalkEveryPlanUpTo = std::size_t{1} << 12;
constexpr std::size_t kMoveStarts = 4;
constexpr std::uint64_t kPassedOver = std::numeric_limits<std::uint64_t>::max();

// What asking the step model once costs, in its regions and segments (each walked with what it
// holds) and its storages (a flag each to clear: a 512th of a segment's cost, as measured).
std::size_t step_size(const RegionProfile& profile) {
  const StepMemory& step = step_of(profile);
  return 1 + profile.regions.size() + step.segments.size() + step.storages.size() / 512;
}

}  // namespace

PeakPlanSearch::PeakPlanSearch(const RegionProfile& profile, PeakGoal goal, std::uint64_t peak_bytes,
                               std::uint64_t host_budget_bytes)
    : profile_(profile),
      model_(profile, step_of(profile)),
      goal_(goal),
      peak_bytes_(goal == PeakGoal::least_peak ? 0 : peak_bytes),
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
    if (offloadable_within(region, host_budget_bytes)) {
      copy_seconds_[r] = offload_seconds(profile, region);
      options_[r].push_back(Option::offload);
    }
    std::stable_sort(options_[r].begin(), options_[r].end(),
                     [&](Option a, Option b) { return cost(r, a) < cost(r, b); });
  }
  std::size_t plans = 1;
  for (const std::vector<Option>& options : options_) plans = std::min(plans * options.size(), kWalkEveryPlanUpTo + 1);
  if (plans <= kWalkEveryPlanUpTo) most_walked_ = std::max(most_walked_, plans);
  current_.choices.assign(n, Choice::save);
  current_.offloaded.assign(n, false);
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), std::size_t{0});
  // Dearest regions first, so that the time bound bites near the root.
  std::stable_sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
    return profile.regions[a].seconds > profile.regions[b].seconds;
  });
}

std::uint64_t PeakPlanSearch::seed(const std::vector<Choice>& choices, const std::vector<bool>& offloaded) {
  PeakCandidate c;
  c.choices = choices;
  c.offloaded = offloaded.empty() ? std::vector<bool>(choices.size(), false) : offloaded;
  c.seconds = 0;
  for (std::size_t r = 0; r < choices.size(); ++r) {
    const Option option = option_of(c, r);  // one the region may take (its pins, the host budget)?
    if (std::find(options_[r].begin(), options_[r].end(), option) == options_[r].end()) return kPassedOver;
    c.seconds += cost(r, option);
    c.host += c.offloaded[r] ? profile_.regions[r].offload_bytes : 0;
  }
  if (c.host > host_budget_) return kPassedOver;
  for (const PeakCandidate& seeded : seeds_) {
    if (seeded.same_plan(c)) return seeded.peak;
  }
  weigh(c);
  seeds_.push_back(c);
  return c.peak;
}

void PeakPlanSearch::move() {
  if (goal_ == PeakGoal::fastest && !found()) {
    goal_ = PeakGoal::least_peak;
    move_from_starts();
    goal_ = PeakGoal::fastest;
  }
  move_from_starts();
}

bool PeakPlanSearch::walk() {
  current_.seconds = 0;
  current_.host = 0;
  return visit(0);
}

double PeakPlanSearch::cost(std::size_t r, Option option) const {
  if (option == Option::recompute) return profile_.regions[r].seconds;
  if (option == Option::offload) return copy_seconds_[r];
  return 0;
}

PeakPlanSearch::Option PeakPlanSearch::option_of(const PeakCandidate& c, std::size_t r) {
  if (c.offloaded[r]) return Option::offload;
  return c.choices[r] == Choice::save ? Option::save : Option::recompute;
}

// Runs region r of `c` as `option`, its time and host bytes following.
void PeakPlanSearch::set(PeakCandidate& c, std::size_t r, Option option) const {
  const Option before = option_of(c, r);
  c.seconds += cost(r, option) - cost(r, before);
  if (before == Option::offload) c.host -= profile_.regions[r].offload_bytes;
  if (option == Option::offload) c.host += profile_.regions[r].offload_bytes;
  c.choices[r] = option == Option::recompute ? Choice::recompute : Choice::save;
  c.offloaded[r] = option == Option::offload;
}

// Sets c.peak, and takes c as the best plan where it is.
void PeakPlanSearch::weigh(PeakCandidate& c) {
  c.peak = model_.peak(c.choices, c.offloaded);
  lowest_peak_ = std::min(lowest_peak_, c.peak);
  if (c.peak > peak_bytes_) return;
  if (c.seconds < best_.seconds || (c.seconds == best_.seconds && c.peak < best_.peak)) best_ = c;
}

// Whether `to` is a better plan than `from` (which is within the peak, for the fastest).
bool PeakPlanSearch::better(const PeakCandidate& to, const PeakCandidate& from) const {
  if (goal_ == PeakGoal::least_peak) return to.peak < from.peak;
  return to.peak <= peak_bytes_ && (to.seconds < from.seconds || (to.seconds == from.seconds && to.peak < from.peak));
}

// The best kMoveStarts plans to move from: the seeds (and the best plan found) within the peak,
// fastest first; for the least peak, the seeds lowest first. First-better moves from each, then
// best moves from each.
void PeakPlanSearch::move_from_starts() {
  if (goal_ == PeakGoal::fastest && found() && best_.seconds <= 0) return;  // nothing is faster
  std::vector<const PeakCandidate*> starts;
  for (const PeakCandidate& c : seeds_) {
    if (goal_ == PeakGoal::least_peak || c.peak <= peak_bytes_) starts.push_back(&c);
  }
  const PeakCandidate best = best_;
  if (goal_ == PeakGoal::fastest && found()) starts.push_back(&best);
  std::stable_sort(starts.begin(), starts.end(), [&](const PeakCandidate* a, const PeakCandidate* b) {
    if (goal_ == PeakGoal::least_peak) return a->peak < b->peak;
    return a->seconds < b->seconds || (a->seconds == b->seconds && a->peak < b->peak);
  });
  starts.erase(std::unique(starts.begin(), starts.end(),
                           [](const PeakCandidate* a, const PeakCandidate* b) { return a->same_plan(*b); }),
               starts.end());
  starts.resize(std::min(starts.size(), kMoveStarts));
  for (const bool first : {true, false}) {
    for (const PeakCandidate* start : starts) move_from(*start, first);
  }
}

// Region r to `a` and (where q is not r) region q to `b`, weighed where the move could be better
// (faster, within the host budget); taken as `next` where it is better than `at` and than `next`.
void PeakPlanSearch::try_move(const PeakCandidate& at, std::size_t r, Option a, std::size_t q, Option b,
                              PeakCandidate& next) {
  PeakCandidate to = at;
  set(to, r, a);
  if (q != r) set(to, q, b);
  if (to.host > host_budget_ || (goal_ == PeakGoal::fastest && to.seconds >= at.seconds)) return;
  ++moves_;
  weigh(to);
  if (better(to, at) && (next.choices.empty() || better(to, next))) next = std::move(to);
}

// Moves from `at` (one region's option changed, or two regions'; for the fastest plan, the first
// of them cheaper), taken until none is better or the moves' limit is reached: the first better
// move found where `first`, else the best of every move. The least peak's moves stop where a plan
// fits the budget (lowering the peak to find one for the fastest).
void PeakPlanSearch::move_from(PeakCandidate at, bool first) {
  for (;;) {
    PeakCandidate next;
    const auto done = [&] { return moves_ >= most_moves_ || (first && !next.choices.empty()) || lowered_enough(); };
    for (std::size_t i = 0; i < order_.size() && !done(); ++i) {
      const std::size_t r = order_[i];
      const Option now = option_of(at, r);
      for (const Option a : options_[r]) {
        if (done()) break;
        if (a == now || (goal_ == PeakGoal::fastest && cost(r, a) >= cost(r, now))) continue;
        try_move(at, r, a, r, a, next);
        // For the least peak a pair is the same move either way round: each once.
        for (std::size_t j = goal_ == PeakGoal::least_peak ? i + 1 : 0; j < order_.size(); ++j) {
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

// The walk below the i-th region of order_; false where it stopped at its limit.
bool PeakPlanSearch::visit(std::size_t i) {
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

}  // namespace remat::budget::detail
