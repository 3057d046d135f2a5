#pragma once
// What every solver checks and decides first, before it weighs any region against another.

#include <remat/budget/plan.hpp>

#include "bytes_text.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace remat::budget {

// Throws BudgetError for a budget below base_bytes (naming that minimum) or a profile whose
// seconds do not add up (check_seconds_add_up).
inline void check_plannable(const RegionProfile& profile, std::uint64_t budget_bytes) {
  if (budget_bytes < profile.base_bytes) {
    throw BudgetError("a budget of " + bytes_text(budget_bytes) + " is below what the checkpoints keep with every "
                      "region recomputed, their inputs: " + bytes_text(profile.base_bytes) +
                      "; the smallest budget a plan can meet is " + std::to_string(profile.base_bytes) + " bytes");
  }
  check_seconds_add_up(profile);
}

// The choice that costs nothing either way: recompute a region that takes no time, save one that
// keeps no bytes. None where the solver must weigh it.
inline std::optional<Choice> free_choice(const RegionCost& region) {
  if (region.seconds <= 0) return Choice::recompute;
  if (region.saved_bytes == 0) return Choice::save;
  return std::nullopt;
}

}  // namespace remat::budget
