// Plans by step peak (step_peak.hpp): every plan tried where the profile is small, the frontier
// by kept bytes beyond; each plan's peak from the step model (step_model.hpp).

#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "bytes_text.hpp"
#include "peak_plan_search.hpp"
#include "step_model.hpp"
#include "unproved_choices.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace remat::budget {

namespace {

using detail::step_of;

double recompute_seconds(const RegionProfile& profile, const std::vector<Choice>& choices) {
  double seconds = 0;
  for (std::size_t r = 0; r < choices.size(); ++r) {
    if (choices[r] == Choice::recompute) seconds += profile.regions[r].seconds;
  }
  return seconds;
}

}  // namespace

void check_step(const StepMemory& step, const RegionProfile& profile) {
  const auto check_ids = [&](const std::vector<std::uint32_t>& ids, const std::string& where) {
    for (const std::uint32_t id : ids) {
      if (id >= step.storages.size()) {
        throw BudgetError(where + ": storage " + std::to_string(id) + " is not among the step's " +
                          std::to_string(step.storages.size()) + " storages");
      }
    }
  };
  for (std::size_t k = 0; k < step.checkpoints.size(); ++k) {
    const StepCheckpoint& call = step.checkpoints[k];
    const std::string where = "$.step.checkpoints[" + std::to_string(k) + "]";
    check_ids(call.inputs, where + ".inputs");
    check_ids(call.kept_inputs, where + ".kept_inputs");
    if (call.body_inputs) {
      for (const std::uint32_t id : *call.body_inputs) {
        if (std::find(call.inputs.begin(), call.inputs.end(), id) == call.inputs.end()) {
          throw BudgetError(where + ".body_inputs: storage " + std::to_string(id) +
                            " is not among the call's inputs (what code outside its regions reads of them); "
                            "profile the step again");
        }
      }
    }
    check_ids(call.outputs, where + ".outputs");
    for (std::size_t r = 0; r < call.regions.size(); ++r) {
      const std::string at = where + ".regions[" + std::to_string(r) + "]";
      check_ids(call.regions[r].kept, at + ".kept");
      check_ids(call.regions[r].inputs, at + ".inputs");
      check_ids(call.regions[r].outputs, at + ".outputs");
      check_ids(call.regions[r].offload_kept, at + ".offload_kept");
      for (std::size_t o = 0; o < call.regions[r].ops.size(); ++o) {
        check_ids(call.regions[r].ops[o].outputs, at + ".ops[" + std::to_string(o) + "].outputs");
      }
      check_ids(call.regions[r].autocast_cached, at + ".autocast_cached");
      check_ids(call.regions[r].saved, at + ".saved");
    }
    for (std::size_t i = 0; i < call.create_graph_backwards.size(); ++i) {
      if (call.create_graph_backwards[i].second > step.segments.size()) {
        throw BudgetError(where + ".create_graph_backwards[" + std::to_string(i) + "]: segment " +
                          std::to_string(call.create_graph_backwards[i].second) + " is past the step's " +
                          std::to_string(step.segments.size()) + " segments; profile the step again");
      }
    }
  }
  if (!step.freed_in.empty() && step.freed_in.size() != step.storages.size()) {
    throw BudgetError("$.step.freed_in: lists " + std::to_string(step.freed_in.size()) + " storages, the step has " +
                      std::to_string(step.storages.size()) + "; profile the step again");
  }
  for (std::size_t i = 0; i < step.freed_in.size(); ++i) {
    if (step.freed_in[i] >= static_cast<std::int64_t>(step.segments.size())) {
      throw BudgetError("$.step.freed_in[" + std::to_string(i) + "]: segment " + std::to_string(step.freed_in[i]) +
                        " is not among the step's " + std::to_string(step.segments.size()) +
                        " segments; profile the step again");
    }
  }
  for (std::size_t s = 0; s < step.segments.size(); ++s) {
    const StepSegment& segment = step.segments[s];
    const std::string where = "$.step.segments[" + std::to_string(s) + "]";
    for (const std::uint32_t k : segment.live) {
      if (k >= step.checkpoints.size()) throw BudgetError(where + ".live: no checkpoint call " + std::to_string(k));
    }
    for (const std::int64_t k : {segment.forward, segment.backward}) {
      if (k >= static_cast<std::int64_t>(step.checkpoints.size())) {
        throw BudgetError(where + ": no checkpoint call " + std::to_string(k));
      }
    }
    if (segment.peak_bytes < segment.start_bytes) {
      throw BudgetError(where + ": peak_bytes is below start_bytes; a segment's peak is at least where it began");
    }
  }
  for (std::size_t i = 0; i < step.autocast_cleared.size(); ++i) {
    const std::uint32_t s = step.autocast_cleared[i];
    const std::string where = "$.step.autocast_cleared[" + std::to_string(i) + "]: segment " + std::to_string(s);
    if (s == 0 || s >= step.segments.size()) {
      const std::size_t count = step.segments.size();
      const std::string segments = count < 2 ? "after the first: it has " + std::to_string(count) + " segment(s)"
                                             : "1 to " + std::to_string(count - 1);
      throw BudgetError(where + " is not one of the step's segments " + segments +
                        " (a clear begins a segment after the first); profile the step again");
    }
    if (i > 0 && s <= step.autocast_cleared[i - 1]) {
      throw BudgetError(where + " is not after the one before it; profile the step again");
    }
  }
  detail::region_indexes(profile, step);
}

std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices) {
  detail::StepModel model(profile, step_of(profile));
  return model.peak(choices);
}

namespace {

// predict_step_peak's overloads: `offloaded` empty or one per region, `kept_ops` null or one list per
// region; checked against `choices` (an offloaded region runs saved, one keeping ops recomputes).
std::uint64_t predicted_peak(const RegionProfile& profile, const std::vector<Choice>& choices,
                             const std::vector<bool>& offloaded, const KeptOps* kept_ops) {
  if (!offloaded.empty() && offloaded.size() != choices.size()) {
    throw BudgetError("predict_step_peak: " + std::to_string(offloaded.size()) + " offload flags for " +
                      std::to_string(choices.size()) + " choices");
  }
  if (kept_ops != nullptr && kept_ops->size() != choices.size()) {
    throw BudgetError("predict_step_peak: kept ops of " + std::to_string(kept_ops->size()) + " regions for " +
                      std::to_string(choices.size()) + " choices");
  }
  for (std::size_t r = 0; r < choices.size(); ++r) {
    if (!offloaded.empty() && offloaded[r] && choices[r] != Choice::save) {
      throw BudgetError("predict_step_peak: region '" + profile.regions[r].name +
                        "' is offloaded and recomputed; an offloaded region runs saved");
    }
    if (kept_ops != nullptr && !(*kept_ops)[r].empty() && choices[r] != Choice::recompute) {
      throw BudgetError("predict_step_peak: region '" + profile.regions[r].name +
                        "' is saved and keeps ops; a region keeps ops only while it recomputes");
    }
  }
  detail::StepModel model(profile, step_of(profile));
  return model.peak(choices, offloaded, kept_ops);
}

}  // namespace

std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices,
                                const std::vector<bool>& offloaded) {
  if (offloaded.size() != choices.size()) {
    throw BudgetError("predict_step_peak: " + std::to_string(offloaded.size()) + " offload flags for " +
                      std::to_string(choices.size()) + " choices");
  }
  return predicted_peak(profile, choices, offloaded, nullptr);
}

std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices,
                                const KeptOps& kept_ops) {
  return predicted_peak(profile, choices, {}, &kept_ops);
}

std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices,
                                const std::vector<bool>& offloaded, const KeptOps& kept_ops) {
  return predicted_peak(profile, choices, offloaded, &kept_ops);
}

namespace detail {

void finish_peak_plan(Plan& plan, bool exact, std::uint64_t peak_bytes, std::uint64_t peak) {
  plan.budget_bytes = plan.kept_bytes;
  plan.exact = exact;
  plan.least_recompute_seconds = exact ? plan.recompute_seconds : 0;
  plan.peak_budget_bytes = peak_bytes;
  plan.peak_bytes = peak;
}

void refuse_peak(const StepMemory& step, std::uint64_t peak_bytes, std::uint64_t lowest_peak,
                 const std::string& among) {
  const std::uint64_t fixed = std::max(step.start_bytes, step.end_bytes);
  const double share = lowest_peak == 0 ? 0 : static_cast<double>(fixed) / static_cast<double>(lowest_peak);
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.0f%%", share * 100);
  throw BudgetError("a step peak of " + bytes_text(peak_bytes) + " is below every plan's: the least any plan reaches is " +
                    bytes_text(lowest_peak) + among +
                    ". What stays allocated through "
                    "the step (parameters, gradients and optimizer state, the batch: " +
                    bytes_text(fixed) + ") is " + percent +
                    " of it: recompute cannot reduce that part. Give a peak of at least " + std::to_string(lowest_peak) +
                    " bytes, or make the step smaller (a smaller batch or sequence, fewer parameters on this device)");
}

}  // namespace detail

namespace {

struct PeakSearch {
  std::vector<Choice> best;  // the least recompute time within the peak; empty where none fits
  std::uint64_t best_peak = 0;
  double best_seconds = std::numeric_limits<double>::infinity();
  std::uint64_t lowest_peak = std::numeric_limits<std::uint64_t>::max();
  bool every_plan = false;
};

constexpr std::size_t kEveryPlanUpTo = 16;
constexpr std::size_t kGridBudgets = 17;
constexpr std::size_t kRefinements = 8;

// `choices` with every pinned region's choice (must_save, must_recompute).
std::vector<Choice> pinned(const RegionProfile& profile, std::vector<Choice> choices) {
  for (std::size_t r = 0; r < choices.size(); ++r) {
    if (!profile.regions[r].must_save.empty()) choices[r] = Choice::save;
    if (!profile.regions[r].must_recompute.empty()) choices[r] = Choice::recompute;
  }
  return choices;
}

// The i-th of `parts` equal steps from `from` to `to`.
std::uint64_t between(std::uint64_t from, std::uint64_t to, std::size_t i, std::size_t parts) {
  if (i >= parts) return to;
  const long double share = static_cast<long double>(i) / static_cast<long double>(parts);
  return from + static_cast<std::uint64_t>(share * static_cast<long double>(to - from));
}

// Beyond kEveryPlanUpTo regions the plans weighed are plans by kept bytes, without solve's proof
// (unproved_choices): at kGridBudgets budgets evenly spaced from the least the checkpoints keep to
// all they could keep, kRefinements more between the grid's neighbours of its lowest peak, and
// kRefinements bisecting between the largest grid budget whose plan fits `peak_bytes` and the next
// (the peak grows with the budget, though not strictly); then solve's own plan at the largest
// budget found to fit, which spares at least as much as the unproved one there. They seed the moves
// of peak_plan_search.hpp, which find faster plans from them (one region's choice changed, or two
// regions' at once). Where none fits the peak, the seeds are those of least_step_peak's search (the
// first two steps do not depend on `peak_bytes`, the last two only where a plan fits) and the moves
// follow that search's, so every search finds a plan at the peak least_step_peak names.

PeakSearch search_peak(const RegionProfile& profile, std::uint64_t peak_bytes) {
  const StepMemory& step = step_of(profile);
  check_seconds_add_up(profile);
  const std::size_t n = profile.regions.size();
  PeakSearch found;
  found.every_plan = n <= kEveryPlanUpTo;
  if (found.every_plan) {
    detail::StepModel model(profile, step);
    const auto consider = [&](std::vector<Choice> choices) {
      choices = pinned(profile, std::move(choices));
      const std::uint64_t peak = model.peak(choices);
      const double seconds = recompute_seconds(profile, choices);
      found.lowest_peak = std::min(found.lowest_peak, peak);
      if (peak <= peak_bytes &&
          (seconds < found.best_seconds || (seconds == found.best_seconds && peak < found.best_peak))) {
        found.best = choices;
        found.best_peak = peak;
        found.best_seconds = seconds;
      }
    };
    // Every plan, by its recompute time (ties in the order of their masks): the first within the
    // peak is the fastest, and only those as fast are weighed after it, for the lower peak. A peak
    // no plan meets weighs them all, so the least peak is the least of all (least_step_peak asks 0:
    // in any order). A mask's bits are the regions no pin decides, in their order.
    std::vector<std::size_t> open;
    for (std::size_t r = 0; r < n; ++r) {
      if (profile.regions[r].must_save.empty() && profile.regions[r].must_recompute.empty()) open.push_back(r);
    }
    const auto plan_of_mask = [&](std::uint64_t mask) {
      std::vector<Choice> choices(n);
      for (std::size_t r = 0; r < n; ++r) {  // pinned as consider() pins them
        choices[r] = profile.regions[r].must_recompute.empty() ? Choice::save : Choice::recompute;
      }
      for (std::size_t b = 0; b < open.size(); ++b) {
        choices[open[b]] = (mask >> b) & 1 ? Choice::recompute : Choice::save;
      }
      return choices;
    };
    std::vector<std::pair<double, std::uint64_t>> by_seconds(std::size_t{1} << open.size());
    for (std::uint64_t mask = 0; mask < by_seconds.size(); ++mask) {
      by_seconds[mask] = {recompute_seconds(profile, plan_of_mask(mask)), mask};
    }
    if (peak_bytes > 0) std::sort(by_seconds.begin(), by_seconds.end());
    for (const auto& [seconds, mask] : by_seconds) {
      if (seconds > found.best_seconds) break;
      consider(plan_of_mask(mask));
    }
  } else {
    // The plans by kept bytes seed peak_plan_search.hpp's search, whose moves go on from them.
    detail::PeakPlanSearch search(profile, detail::PeakGoal::fastest, peak_bytes, 0);
    const auto seed = [&](std::vector<Choice> choices) { return search.seed(pinned(profile, std::move(choices))); };
    seed(std::vector<Choice>(n, Choice::recompute));
    seed(std::vector<Choice>(n, Choice::save));
    const auto by_kept_bytes = [&](std::uint64_t budget) { return seed(detail::unproved_choices(profile, budget)); };
    // The grid, and between its neighbours of its lowest peak.
    const std::uint64_t low = least_kept_bytes(profile), high = profile.all_saved_bytes();
    std::vector<std::uint64_t> budgets, peaks;
    for (std::size_t i = 0; i < kGridBudgets; ++i) {
      const std::uint64_t budget = between(low, high, i, kGridBudgets - 1);
      if (!budgets.empty() && budgets.back() == budget) continue;  // a narrow range: each budget once
      budgets.push_back(budget);
      peaks.push_back(by_kept_bytes(budget));
    }
    const auto lowest = static_cast<std::size_t>(std::min_element(peaks.begin(), peaks.end()) - peaks.begin());
    const std::uint64_t from = budgets[lowest == 0 ? 0 : lowest - 1];
    const std::uint64_t to = budgets[std::min(lowest + 1, budgets.size() - 1)];
    for (std::size_t i = 1; i <= kRefinements && to - from > kRefinements; ++i) {
      by_kept_bytes(between(from, to, i, kRefinements + 1));
    }
    // Bisected between the largest grid budget whose plan fits and the next above it.
    std::size_t fits = budgets.size();
    for (std::size_t i = 0; i < budgets.size(); ++i) {
      if (peaks[i] <= peak_bytes) fits = i;
    }
    if (fits + 1 < budgets.size()) {
      std::uint64_t under = budgets[fits], over = budgets[fits + 1];
      for (std::size_t i = 0; i < kRefinements && over - under > 1; ++i) {
        const std::uint64_t middle = under + (over - under) / 2;
        (by_kept_bytes(middle) <= peak_bytes ? under : over) = middle;
      }
      seed(choices_of(solve(profile, under)));
    }
    search.move();
    found.lowest_peak = search.lowest_peak();
    if (search.found()) {
      found.best = search.best().choices;
      found.best_peak = search.best().peak;
      found.best_seconds = recompute_seconds(profile, found.best);
    }
  }
  return found;
}

}  // namespace

std::vector<Choice> choices_of(const Plan& plan) {
  std::vector<Choice> choices;
  for (const auto& entry : plan.regions) choices.push_back(entry.second);
  return choices;
}

KeptOps kept_ops_of(const Plan& plan) {
  KeptOps kept(plan.regions.size());
  if (plan.kept_ops.empty()) return kept;
  for (std::size_t r = 0; r < plan.regions.size(); ++r) {
    for (const OpCost& op : plan.kept_ops[r]) kept[r].push_back(op.index);
  }
  return kept;
}

std::uint64_t least_step_peak(const RegionProfile& profile) { return search_peak(profile, 0).lowest_peak; }

Plan solve_peak(const RegionProfile& profile, std::uint64_t peak_bytes) {
  const StepMemory& step = step_of(profile);
  const std::size_t n = profile.regions.size();
  PeakSearch found = search_peak(profile, peak_bytes);
  const bool every_plan = found.every_plan;
  const std::vector<Choice>& best = found.best;
  const std::uint64_t lowest_peak = found.lowest_peak;
  if (best.empty()) detail::refuse_peak(step, peak_bytes, lowest_peak, every_plan ? "" : " among the plans tried");
  Plan plan;
  plan.base_bytes = profile.base_bytes;
  plan.kept_bytes = profile.base_bytes;
  for (std::size_t r = 0; r < n; ++r) {
    if (best[r] == Choice::save) plan.kept_bytes += profile.regions[r].saved_bytes;
    plan.regions.emplace_back(profile.regions[r], best[r]);
  }
  plan.recompute_seconds = found.best_seconds;
  // A plan that adds no time is the fastest there is, whether every plan was weighed or not.
  detail::finish_peak_plan(plan, every_plan || found.best_seconds <= 0, peak_bytes, found.best_peak);
  return plan;
}

}  // namespace remat::budget
