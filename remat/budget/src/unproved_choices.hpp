#pragma once
// Plans by kept bytes cheap enough for the searches by step peak to weigh dozens of at 10,000
// regions: solve's knapsack stopped before its proof, solve_offload's relaxation without its
// search, and only the choices they make.

#include <remat/budget/plan.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace remat::budget::detail {

// Each region's choice in solve's plan without the proof: the greedy choice bettered by a search
// of the regions around the break region (solve_knapsack with prove false).
std::vector<Choice> unproved_choices(const RegionProfile& profile, std::uint64_t budget_bytes);

// Each region's choice and whether it is offloaded in solve_offload's plan without its search: the
// best plan the prices of its relaxation lead to, topped up.
std::pair<std::vector<Choice>, std::vector<bool>> unproved_offload_choices(const RegionProfile& profile,
                                                                           std::uint64_t budget_bytes,
                                                                           std::uint64_t host_budget_bytes);

}  // namespace remat::budget::detail
