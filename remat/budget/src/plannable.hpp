#pragma once
// What every solver checks and decides first, before it weighs any region against another, and
// the terms it weighs the rest in: each region's save, and the gain of an option at a price.

#include <remat/budget/plan.hpp>

#include "bytes_text.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::budget {

// Throws BudgetError for a budget below least_kept_bytes (naming that minimum and what it is made
// of) or a profile whose seconds do not add up (check_seconds_add_up). Returns what the budget
// leaves for the regions a solver weighs: budget_bytes less least_kept_bytes.
inline std::uint64_t check_plannable(const RegionProfile& profile, std::uint64_t budget_bytes) {
  const std::uint64_t least = least_kept_bytes(profile);
  if (budget_bytes < least) {
    std::string kept = "what the checkpoints keep with every region recomputed, their inputs: " +
                       bytes_text(profile.base_bytes);
    if (least != profile.base_bytes) {
      std::string pinned;
      for (const RegionCost& region : profile.regions) {
        if (!region.must_save.empty()) pinned += (pinned.empty() ? "'" : ", '") + region.name + "'";
      }
      kept = "what every plan keeps: the checkpoints' inputs, " + bytes_text(profile.base_bytes) +
             ", and the regions that must be saved (" + pinned + "), " + bytes_text(least - profile.base_bytes);
    }
    throw BudgetError("a budget of " + bytes_text(budget_bytes) + " is below " + kept +
                      "; the smallest budget a plan can meet is " + std::to_string(least) + " bytes");
  }
  check_seconds_add_up(profile);
  return budget_bytes - least;
}

// The choice made before any weighing: save a region that must be saved (its bytes are in
// least_kept_bytes), recompute one that must be recomputed; the one that costs nothing either
// way, recompute a region that takes no time, save one that keeps no bytes. None where the solver
// must weigh it.
inline std::optional<Choice> free_choice(const RegionCost& region) {
  if (!region.must_save.empty()) return Choice::save;
  if (!region.must_recompute.empty()) return Choice::recompute;
  if (region.seconds <= 0) return Choice::recompute;
  if (region.saved_bytes == 0) return Choice::save;
  return std::nullopt;
}

// A region a solver must weigh, and what saving it takes: its bytes, which the capacity may not
// hold, for its seconds.
struct Weighed {
  std::size_t region = 0;  // its index in the profile
  bool can_save = false;
  std::uint64_t save_bytes = 0;
  double save_value = 0;  // its seconds

  // What saving it gains at a price per byte of what it keeps: 0 where it cannot be saved.
  double save_gain(double per_byte) const {
    return can_save ? save_value - per_byte * static_cast<double>(save_bytes) : 0;
  }
};

// A solver's choice among a region's options, tried in order: `mode` is chosen where its gain
// beats the best so far (0 before any, so an option that gains nothing is never chosen).
template <typename Mode>
void take_if_better(double gain, Mode mode, double& best, Mode& chosen) {
  if (gain > best) {
    best = gain;
    chosen = mode;
  }
}

// Sets choices[r] for each region with a free choice and calls weigh(Weighed) for every other
// region, in order.
template <typename Weigh>
void weigh_regions(const RegionProfile& profile, std::uint64_t capacity, std::vector<Choice>& choices, Weigh weigh) {
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    const RegionCost& region = profile.regions[r];
    if (const auto free = free_choice(region)) {
      choices[r] = *free;
      continue;
    }
    weigh(Weighed{r, region.saved_bytes <= capacity, region.saved_bytes, region.seconds});
  }
}

}  // namespace remat::budget
