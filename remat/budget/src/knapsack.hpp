#pragma once
// The 0/1 knapsack behind budget plans: which items (regions) to take (save) so that their bytes
// fit a capacity and their seconds (the recompute time saving them spares) add up to the most.
// Proved optimal wherever the methods in knapsack.cpp can prove it; otherwise the best choice a
// bounded search finds, with an upper bound on what any choice could reach.

#include <cstdint>
#include <vector>

namespace remat::budget::detail {

struct KnapsackItem {
  std::uint64_t bytes = 0;  // more than 0
  double seconds = 0;       // more than 0 and finite
};

struct KnapsackChoice {
  std::vector<bool> taken;  // by index in the items
  // No choice within the capacity takes more seconds than most_seconds; when proved_optimal, the
  // taken items' seconds are that most (to within a relative 1e-12 of all items' seconds).
  bool proved_optimal = true;
  double most_seconds = 0;
};

// `prove` false: the incumbent the proof would start from (the greedy choice, bettered by a search
// of the items around the break item), proved_optimal only where it meets the relaxation; a
// fraction of the time where the proof would search.
KnapsackChoice solve_knapsack(const std::vector<KnapsackItem>& items, std::uint64_t capacity, bool prove = true);

}  // namespace remat::budget::detail
