// Step peaks of plans (step_peak.hpp): what each checkpoint call keeps under a plan, as a set of
// storages, then each segment's peak less what the plan no longer keeps of what was alive there.

#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "bytes_text.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace remat::budget {

namespace {

// The profile region each step region takes its choice from.
std::vector<std::vector<std::size_t>> region_indexes(const RegionProfile& profile, const StepMemory& step) {
  std::unordered_map<std::string, std::size_t> exact;
  for (std::size_t r = 0; r < profile.regions.size(); ++r) exact.emplace(profile.regions[r].name, r);
  std::vector<std::vector<std::size_t>> indexes;
  for (const StepCheckpoint& call : step.checkpoints) {
    std::vector<std::size_t>& of_call = indexes.emplace_back();
    for (const StepRegion& region : call.regions) {
      std::size_t found = profile.regions.size();
      if (const auto it = exact.find(region.name); it != exact.end()) {
        found = it->second;
      } else {
        for (std::size_t r = 0; r < profile.regions.size() && found == profile.regions.size(); ++r) {
          if (matches(profile.regions[r].name, region.name)) found = r;
        }
      }
      if (found == profile.regions.size()) {
        throw BudgetError("the profile's step lists region '" + region.name +
                          "', which its regions do not: the "
                          "profile contradicts itself; profile the step again (remat.profile_regions())");
      }
      of_call.push_back(found);
    }
  }
  return indexes;
}

// A sum of the step's byte figures. The dump reader bounds each figure, so only a step made some
// other way can pass 2^64; it is refused rather than wrapped into a small peak.
std::uint64_t add_bytes(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    throw BudgetError(
        "the step's byte figures add up past 64 bits, so no step peak can be predicted from them: the "
        "step is not a real one; profile it again");
  }
  return sum;
}

bool contains(const std::vector<std::uint32_t>& set, std::uint32_t id) {
  return std::find(set.begin(), set.end(), id) != set.end();
}

// What plans need of a step, computed once per profile.
class StepModel {
 public:
  StepModel(const RegionProfile& profile, const StepMemory& step)
      : step_(step), indexes_(region_indexes(profile, step)), stamp_(step.storages.size(), 0) {
    // Outputs of a call that no later call takes as input are held by code outside the
    // checkpoints (a head, a loss): alive while the call is live whatever it keeps.
    held_until_.resize(step.checkpoints.size());
    for (std::size_t k = 0; k < step.checkpoints.size(); ++k) {
      for (const std::uint32_t id : step.checkpoints[k].outputs) {
        std::int64_t consumer = -1;
        for (std::size_t later = k + 1; later < step.checkpoints.size() && consumer < 0; ++later) {
          if (contains(step.checkpoints[later].inputs, id)) consumer = static_cast<std::int64_t>(later);
        }
        held_until_[k].emplace_back(id, consumer);
      }
    }
    std::vector<Choice> all_saved(profile.regions.size(), Choice::save);
    saved_sets_ = kept_sets(all_saved);
    for (const StepSegment& segment : step.segments) saved_alive_.push_back(alive_bytes(segment, saved_sets_, {}));
  }

  std::uint64_t peak(const std::vector<Choice>& choices) {
    const std::vector<std::vector<std::uint32_t>> sets = kept_sets(choices);
    std::map<std::tuple<const std::vector<std::uint32_t>*, std::int64_t, std::int64_t>, std::uint64_t> cache;
    std::uint64_t peak = 0;
    for (std::size_t s = 0; s < step_.segments.size(); ++s) {
      const StepSegment& segment = step_.segments[s];
      const std::vector<std::uint32_t> recomputed =
          segment.backward >= 0 ? recomputed_saved(static_cast<std::size_t>(segment.backward), choices)
                                : std::vector<std::uint32_t>{};
      std::uint64_t alive = alive_bytes(segment, sets, recomputed);
      std::uint64_t top = segment.peak_bytes;
      if (segment.backward >= 0) {
        top = std::max(top, add_bytes(segment.start_bytes,
                                      recompute_transient(static_cast<std::size_t>(segment.backward), choices)));
      }
      const std::uint64_t freed = saved_alive_[s] > alive ? saved_alive_[s] - alive : 0;
      const std::uint64_t added = alive > saved_alive_[s] ? alive - saved_alive_[s] : 0;
      peak = std::max(peak, add_bytes(top - std::min(top, freed), added));
    }
    return peak;
  }

 private:
  // What each checkpoint call keeps: the inputs code outside its regions reads; its saved
  // regions' kept storages, less the inputs of a saved region that recompute recreates (the
  // runtime takes them from recompute); and the inputs recompute reads: those a recomputed region
  // takes, or all of them where a recomputed region takes something no region made and the call
  // was not given (code outside the regions made it from the inputs).
  std::vector<std::vector<std::uint32_t>> kept_sets(const std::vector<Choice>& choices) const {
    std::vector<std::vector<std::uint32_t>> sets;
    for (std::size_t k = 0; k < step_.checkpoints.size(); ++k) {
      const StepCheckpoint& call = step_.checkpoints[k];
      std::vector<std::uint32_t> set = call.kept_inputs;
      std::vector<std::uint32_t> not_recreated = call.inputs;
      std::vector<std::uint32_t> made;  // every region's outputs
      bool recomputes = false;
      for (std::size_t r = 0; r < call.regions.size(); ++r) {
        made.insert(made.end(), call.regions[r].outputs.begin(), call.regions[r].outputs.end());
        if (choices[indexes_[k][r]] == Choice::save) {
          not_recreated.insert(not_recreated.end(), call.regions[r].outputs.begin(), call.regions[r].outputs.end());
        } else {
          recomputes = true;
        }
      }
      for (std::size_t r = 0; r < call.regions.size(); ++r) {
        const StepRegion& region = call.regions[r];
        if (choices[indexes_[k][r]] == Choice::save) {
          for (const std::uint32_t id : region.kept) {
            const bool recreated = recomputes && contains(region.inputs, id) && !contains(not_recreated, id);
            if (!recreated) set.push_back(id);
          }
          continue;
        }
        for (const std::uint32_t id : region.inputs) {
          if (contains(call.inputs, id)) {
            set.push_back(id);
          } else if (!contains(made, id)) {
            set.insert(set.end(), call.inputs.begin(), call.inputs.end());
          }
        }
      }
      sets.push_back(std::move(set));
    }
    return sets;
  }

  // What recompute brings back in call k's backward: what the regions it recomputes keep while
  // saved, their outputs included (recompute makes them, and code between regions may hold them).
  std::vector<std::uint32_t> recomputed_saved(std::size_t k, const std::vector<Choice>& choices) const {
    std::vector<std::uint32_t> set;
    const StepCheckpoint& call = step_.checkpoints[k];
    for (std::size_t r = 0; r < call.regions.size(); ++r) {
      if (choices[indexes_[k][r]] == Choice::save) continue;
      set.insert(set.end(), call.regions[r].kept.begin(), call.regions[r].kept.end());
    }
    return set;
  }

  std::uint64_t recompute_transient(std::size_t k, const std::vector<Choice>& choices) const {
    std::uint64_t most = 0;
    const StepCheckpoint& call = step_.checkpoints[k];
    for (std::size_t r = 0; r < call.regions.size(); ++r) {
      if (choices[indexes_[k][r]] != Choice::save) most = std::max(most, call.regions[r].transient_bytes);
    }
    return most;
  }

  // Bytes of the storages alive in `segment` because of checkpoints: what the live calls keep,
  // what the call whose forward runs took as input, the outputs code outside holds, and in a call's
  // backward what recompute brings back (`recomputed`).
  std::uint64_t alive_bytes(const StepSegment& segment, const std::vector<std::vector<std::uint32_t>>& sets,
                            const std::vector<std::uint32_t>& recomputed) {
    ++generation_;
    std::uint64_t total = 0;
    const auto add = [&](std::uint32_t id) {
      if (stamp_[id] != generation_) {
        stamp_[id] = generation_;
        total = add_bytes(total, step_.storages[id]);
      }
    };
    const auto is_live = [&](std::int64_t k) {
      return k >= 0 && contains(segment.live, static_cast<std::uint32_t>(k));
    };
    for (const std::uint32_t k : segment.live) {
      for (const std::uint32_t id : sets[k]) add(id);
      for (const auto& [id, consumer] : held_until_[k]) {
        if (!is_live(consumer)) add(id);
      }
    }
    if (segment.forward >= 0) {
      for (const std::uint32_t id : step_.checkpoints[static_cast<std::size_t>(segment.forward)].inputs) add(id);
    }
    for (const std::uint32_t id : recomputed) add(id);
    return total;
  }

  const StepMemory& step_;
  std::vector<std::vector<std::size_t>> indexes_;
  std::vector<std::vector<std::pair<std::uint32_t, std::int64_t>>> held_until_;
  std::vector<std::vector<std::uint32_t>> saved_sets_;
  std::vector<std::uint64_t> saved_alive_;
  std::vector<std::uint32_t> stamp_;
  std::uint32_t generation_ = 0;
};

const StepMemory& step_of(const RegionProfile& profile) {
  if (!profile.step) {
    throw BudgetError(
        "the profile has no step memory, so no plan's step peak can be predicted: profile the step "
        "with its tensors counted, CPU tensors inside remat.tag_cpu_tensors() or CUDA tensors under "
        "remat_alloc.install(), then plan by peak_bytes (or plan by budget_bytes, what the checkpoints "
        "keep)");
  }
  return *profile.step;
}

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
    check_ids(call.outputs, where + ".outputs");
    for (std::size_t r = 0; r < call.regions.size(); ++r) {
      const std::string at = where + ".regions[" + std::to_string(r) + "]";
      check_ids(call.regions[r].kept, at + ".kept");
      check_ids(call.regions[r].inputs, at + ".inputs");
      check_ids(call.regions[r].outputs, at + ".outputs");
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
  region_indexes(profile, step);
}

std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices) {
  StepModel model(profile, step_of(profile));
  return model.peak(choices);
}

namespace {

struct PeakSearch {
  std::vector<Choice> best;  // the least recompute time within the peak; empty where none fits
  std::uint64_t best_peak = 0;
  double best_seconds = std::numeric_limits<double>::infinity();
  std::vector<Choice> lowest;  // the least peak of all
  std::uint64_t lowest_peak = std::numeric_limits<std::uint64_t>::max();
  bool every_plan = false;
};

constexpr std::size_t kEveryPlanUpTo = 16;

PeakSearch search_peak(const RegionProfile& profile, std::uint64_t peak_bytes) {
  const StepMemory& step = step_of(profile);
  check_seconds_add_up(profile);
  StepModel model(profile, step);
  const std::size_t n = profile.regions.size();
  PeakSearch found;
  const auto consider = [&](std::vector<Choice> choices) {
    for (std::size_t r = 0; r < n; ++r) {
      if (!profile.regions[r].must_save.empty()) choices[r] = Choice::save;
    }
    const std::uint64_t peak = model.peak(choices);
    const double seconds = recompute_seconds(profile, choices);
    if (peak < found.lowest_peak) {
      found.lowest_peak = peak;
      found.lowest = choices;
    }
    if (peak <= peak_bytes &&
        (seconds < found.best_seconds || (seconds == found.best_seconds && peak < found.best_peak))) {
      found.best = choices;
      found.best_peak = peak;
      found.best_seconds = seconds;
    }
  };
  found.every_plan = n <= kEveryPlanUpTo;
  if (found.every_plan) {
    std::vector<Choice> choices(n);
    for (std::uint64_t mask = 0; mask < (std::uint64_t{1} << n); ++mask) {
      for (std::size_t r = 0; r < n; ++r) choices[r] = (mask >> r) & 1 ? Choice::recompute : Choice::save;
      consider(choices);
    }
  } else {
    consider(std::vector<Choice>(n, Choice::recompute));
    consider(std::vector<Choice>(n, Choice::save));
    for (const Plan& plan : frontier(profile, 256)) {
      std::vector<Choice> choices;
      for (const auto& entry : plan.regions) choices.push_back(entry.second);
      consider(choices);
    }
  }
  return found;
}

}  // namespace

std::uint64_t least_step_peak(const RegionProfile& profile) { return search_peak(profile, 0).lowest_peak; }

Plan solve_peak(const RegionProfile& profile, std::uint64_t peak_bytes) {
  const StepMemory& step = step_of(profile);
  const std::size_t n = profile.regions.size();
  PeakSearch found = search_peak(profile, peak_bytes);
  const bool every_plan = found.every_plan;
  const std::vector<Choice>& best = found.best;
  const std::uint64_t lowest_peak = found.lowest_peak;
  if (best.empty()) {
    const std::uint64_t fixed = std::max(step.start_bytes, step.end_bytes);
    const double share = lowest_peak == 0 ? 0 : static_cast<double>(fixed) / static_cast<double>(lowest_peak);
    char percent[32];
    std::snprintf(percent, sizeof percent, "%.0f%%", share * 100);
    throw BudgetError(
        "a step peak of " + bytes_text(peak_bytes) + " is below every plan's: the least any plan reaches is " +
        bytes_text(lowest_peak) + (every_plan ? "" : " among the plans tried") +
        ". What stays allocated through "
        "the step (parameters, gradients and optimizer state, the batch: " +
        bytes_text(fixed) + ") is " + percent + " of it: recompute cannot reduce that part. Give a peak of at least " +
        std::to_string(lowest_peak) +
        " bytes, or make the step smaller (a smaller batch or sequence, fewer parameters on this device)");
  }
  Plan plan;
  plan.base_bytes = profile.base_bytes;
  plan.kept_bytes = profile.base_bytes;
  for (std::size_t r = 0; r < n; ++r) {
    if (best[r] == Choice::save) plan.kept_bytes += profile.regions[r].saved_bytes;
    plan.regions.emplace_back(profile.regions[r], best[r]);
  }
  plan.budget_bytes = plan.kept_bytes;
  plan.recompute_seconds = found.best_seconds;
  plan.exact = every_plan;
  plan.least_recompute_seconds = every_plan ? found.best_seconds : 0;
  plan.peak_budget_bytes = peak_bytes;
  plan.peak_bytes = found.best_peak;
  return plan;
}

}  // namespace remat::budget
