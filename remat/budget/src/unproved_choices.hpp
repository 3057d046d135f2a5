#pragma once
// Plans by kept bytes cheap enough for the searches by step peak to weigh dozens of at 10,000
// regions: solve's knapsack stopped before its proof, and only the choices it makes.

#include <remat/budget/plan.hpp>

#include <cstdint>
#include <vector>

namespace remat::budget::detail {

// Each region's choice in solve's plan without the proof: the greedy choice bettered by a search
// of the regions around the break region (solve_knapsack with prove false).
std::vector<Choice> unproved_choices(const RegionProfile& profile, std::uint64_t budget_bytes);

}  // namespace remat::budget::detail
