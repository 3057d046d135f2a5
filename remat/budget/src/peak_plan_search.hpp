#pragma once
// The search by step peak over each region's options, save, recompute and (within a host budget)
// offload, that the plans by step peak by regions share (step_peak.cpp without offload,
// offload_peak_plan.cpp with it). The peak is no sum over regions, so no knapsack bound holds; the
// search has three steps, each starting from what the one before found:
// - seeds: plans the callers' other solvers make, each weighed;
// - moves: from the fastest few seeds within the peak, one region's option changed, or two
//   regions' at once (one cheaper, the other dearer but smaller on the device): first-better moves
//   from each, then best moves from each, until none is faster;
// - a depth-first walk over every option of every region, cheapest first, pruned where the time
//   spent so far reaches the best plan's (times only add up) or the host bytes pass the host
//   budget. A walk that ends within its limit proves the plan.
// The least peak is searched the same way, moves lowering the peak. The limits on the moves and
// the walk are in plans weighed times the step model's size, which is what asking it once costs,
// so that a large model's plan takes about as long as a small one's.

#include <remat/budget/plan.hpp>

#include "step_model.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace remat::budget::detail {

// What a search looks for: the fastest plan within the peak budget, or the least peak.
enum class PeakGoal : std::uint8_t { fastest, least_peak };

struct PeakCandidate {
  std::vector<Choice> choices;
  std::vector<bool> offloaded;
  double seconds = std::numeric_limits<double>::infinity();
  std::uint64_t peak = 0;
  std::uint64_t host = 0;

  bool same_plan(const PeakCandidate& other) const { return choices == other.choices && offloaded == other.offloaded; }
};

class PeakPlanSearch {
 public:
  // peak_bytes: the budget (ignored for the least peak); regions may be offloaded within
  // host_budget_bytes (0: none; the profile needs copy figures where it is more).
  PeakPlanSearch(const RegionProfile& profile, PeakGoal goal, std::uint64_t peak_bytes,
                 std::uint64_t host_budget_bytes);

  // Weighs a plan from elsewhere as an incumbent and a start for the moves: its predicted peak. One
  // that takes an option a region may not (a pinned region's other choice, an offload beyond the
  // host budget) is passed over: the most bytes there are. `offloaded`: empty (none) or one per region.
  std::uint64_t seed(const std::vector<Choice>& choices, const std::vector<bool>& offloaded = {});

  // The moves. Where no seed fits the peak budget, they first lower the peak as the least peak's
  // search does (the same starts, the same moves, in the same order) until a plan fits, so that a
  // plan is found at any peak that search names; then they look for faster plans within it.
  void move();

  // The walk; true where it ended (the best plan found is then the best there is).
  bool walk();

  const PeakCandidate& best() const { return best_; }
  bool found() const { return best_.seconds < std::numeric_limits<double>::infinity(); }
  std::uint64_t lowest_peak() const { return lowest_peak_; }
  // Per region: what offloading it costs (0 where it may not be offloaded).
  const std::vector<double>& copy_seconds() const { return copy_seconds_; }

 private:
  enum class Option : std::uint8_t { save, recompute, offload };

  double cost(std::size_t r, Option option) const;
  static Option option_of(const PeakCandidate& c, std::size_t r);
  void set(PeakCandidate& c, std::size_t r, Option option) const;
  void weigh(PeakCandidate& c);
  bool better(const PeakCandidate& to, const PeakCandidate& from) const;
  void move_from_starts();
  bool lowered_enough() const { return goal_ == PeakGoal::least_peak && found(); }
  void try_move(const PeakCandidate& at, std::size_t r, Option a, std::size_t q, Option b, PeakCandidate& next);
  void move_from(PeakCandidate at, bool first);
  bool visit(std::size_t i);

  const RegionProfile& profile_;
  StepModel model_;
  PeakGoal goal_;
  std::uint64_t peak_bytes_, host_budget_;
  std::size_t most_moves_, most_walked_;
  std::vector<std::vector<Option>> options_;
  std::vector<double> copy_seconds_;
  std::vector<std::size_t> order_;
  std::vector<PeakCandidate> seeds_;
  PeakCandidate current_, best_;
  std::uint64_t lowest_peak_ = std::numeric_limits<std::uint64_t>::max();
  std::size_t moves_ = 0, walked_ = 0;
};

}  // namespace remat::budget::detail
