// Plans from region profiles: the regions that need no choice (no bytes to save, no time to
// spare, too large for the budget) settled first, the rest chosen by the knapsack in
// knapsack.cpp; the frontier, grouping by name and pattern matching.

#include <remat/budget/plan.hpp>
#include <remat/budget/offload_plan.hpp>

#include "bytes_text.hpp"

#include "knapsack.hpp"
#include "plannable.hpp"
#include "unproved_choices.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace remat::budget {

namespace {

// A pattern makes one choice for every region it stands for: a group with a region that must be
// saved and another that must be recomputed has no choice that serves both, and any plan of it
// would be refused where it is read or applied.
void refuse_mixed_pins(const RegionCost& group, const RegionCost* saved, const RegionCost* recomputed) {
  if (saved == nullptr || recomputed == nullptr) return;
  throw BudgetError("cannot plan by pattern: '" + group.name + "' stands for '" + saved->name +
                    "', which must be saved (" + saved->must_save + "), and for '" + recomputed->name +
                    "', which must be recomputed (" + recomputed->must_recompute +
                    "), and a pattern makes one choice for all its regions; plan each region on its own (without "
                    "group=True; remat-report advise without --group)");
}

}  // namespace

std::string_view to_string(Choice choice) { return choice == Choice::save ? "save" : "recompute"; }

std::uint64_t RegionProfile::all_saved_bytes() const {
  std::uint64_t total = base_bytes;
  for (const RegionCost& region : regions) total += region.saved_bytes;
  return total;
}

void check_seconds_add_up(const RegionProfile& profile) {
  const std::vector<RegionCost>& regions = profile.regions;
  double total = 0;
  for (std::size_t r = 0; r < regions.size(); ++r) {
    total += regions[r].seconds;
    if (!std::isfinite(total)) {
      char largest[32];
      std::snprintf(largest, sizeof largest, "%.17g", std::numeric_limits<double>::max());
      throw BudgetError("the regions' seconds up to '" + regions[r].name + "' (region " + std::to_string(r) +
                        ") add up to more than " + largest + ", the largest number a plan can report as its "
                        "recompute_seconds; divide every region's seconds by the same factor (plans depend only "
                        "on how the regions' seconds compare)");
    }
  }
}

namespace {

// Each region's choice by kept bytes, and what the knapsack says of it: its seconds saved, and
// the most any plan within the budget could save.
struct ByKeptBytes {
  std::vector<Choice> choices;
  bool exact = true;
  double saved_seconds = 0;
  double most_seconds = 0;
};

ByKeptBytes choose_by_kept_bytes(const RegionProfile& profile, std::uint64_t budget_bytes, bool prove) {
  const std::uint64_t capacity = check_plannable(profile, budget_bytes);
  ByKeptBytes chosen;
  chosen.choices.assign(profile.regions.size(), Choice::recompute);
  std::vector<detail::KnapsackItem> items;
  std::vector<std::size_t> item_region;  // the region of each item
  weigh_regions(profile, capacity, chosen.choices, [&](const Weighed& weighed) {
    if (!weighed.can_save) return;
    items.push_back({weighed.save_bytes, weighed.save_value});
    item_region.push_back(weighed.region);
  });
  const detail::KnapsackChoice taken = detail::solve_knapsack(items, capacity, prove);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!taken.taken[i]) continue;
    chosen.choices[item_region[i]] = Choice::save;
    chosen.saved_seconds += items[i].seconds;
  }
  chosen.exact = taken.proved_optimal;
  chosen.most_seconds = taken.most_seconds;
  return chosen;
}

}  // namespace

Plan solve(const RegionProfile& profile, std::uint64_t budget_bytes) {
  const ByKeptBytes chosen = choose_by_kept_bytes(profile, budget_bytes, true);
  Plan plan;
  plan.budget_bytes = budget_bytes;
  plan.base_bytes = profile.base_bytes;
  plan.kept_bytes = profile.base_bytes;
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    const RegionCost& region = profile.regions[r];
    if (chosen.choices[r] == Choice::save) plan.kept_bytes += region.saved_bytes;
    else plan.recompute_seconds += region.seconds;
    plan.regions.emplace_back(region, chosen.choices[r]);
  }
  plan.exact = chosen.exact;
  plan.least_recompute_seconds =
      plan.exact ? plan.recompute_seconds
                 : std::max(0.0, plan.recompute_seconds - (chosen.most_seconds - chosen.saved_seconds));
  return plan;
}

std::vector<Choice> detail::unproved_choices(const RegionProfile& profile, std::uint64_t budget_bytes) {
  return choose_by_kept_bytes(profile, budget_bytes, false).choices;
}

std::uint64_t least_kept_bytes(const RegionProfile& profile) {
  std::uint64_t least = profile.base_bytes;
  for (const RegionCost& region : profile.regions) {
    if (!region.must_save.empty()) least += region.saved_bytes;  // within all_saved_bytes, which readers check
  }
  return least;
}

std::vector<Plan> frontier(const RegionProfile& profile, std::size_t steps) {
  steps = std::max<std::size_t>(steps, 2);
  const std::uint64_t low = least_kept_bytes(profile);
  const std::uint64_t high = profile.all_saved_bytes();
  std::vector<Plan> plans;
  for (std::size_t step = 0; step < steps; ++step) {
    const long double share = static_cast<long double>(step) / static_cast<long double>(steps - 1);
    const std::uint64_t budget =
        step + 1 == steps ? high : static_cast<std::uint64_t>(low + share * static_cast<long double>(high - low));
    if (!plans.empty() && plans.back().budget_bytes == budget) continue;  // a narrow range: each budget once
    plans.push_back(solve(profile, budget));
  }
  return plans;
}

RegionProfile grouped(const RegionProfile& profile) {
  RegionProfile out;
  out.base_bytes = profile.base_bytes;
  out.device = profile.device;
  out.timer = profile.timer;
  out.step = profile.step;  // step regions take their choice from the pattern that matches them
  out.host_copy = profile.host_copy;
  std::unordered_map<std::string, std::size_t> index;
  // By group: its first region that must be saved and its first that must be recomputed, if any.
  std::vector<const RegionCost*> first_saved;
  std::vector<const RegionCost*> first_recomputed;
  for (const RegionCost& region : profile.regions) {
    std::string pattern;
    for (std::size_t i = 0; i < region.name.size(); ++i) {
      if (std::isdigit(static_cast<unsigned char>(region.name[i])) == 0) {
        pattern += region.name[i];
      } else if (pattern.empty() || pattern.back() != '*' ||
                 std::isdigit(static_cast<unsigned char>(region.name[i - 1])) == 0) {
        pattern += '*';
      }
    }
    const double copies = profile.host_copy ? offload_seconds(profile, region) : 0;
    const auto [it, inserted] = index.emplace(pattern, out.regions.size());
    if (inserted) {
      RegionCost group{pattern, region.saved_bytes, region.seconds, region.count};
      group.must_save = region.must_save;
      group.must_recompute = region.must_recompute;
      group.offload_bytes = region.offload_bytes;
      if (profile.host_copy) group.members_offload_seconds = copies;
      out.regions.push_back(std::move(group));
      first_saved.push_back(region.must_save.empty() ? nullptr : &region);
      first_recomputed.push_back(region.must_recompute.empty() ? nullptr : &region);
      continue;
    }
    RegionCost& group = out.regions[it->second];
    group.saved_bytes += region.saved_bytes;
    group.seconds += region.seconds;
    group.count += region.count;
    // A region that cannot be offloaded (it would keep its bytes on the device) makes its group one.
    const bool offloadable = group.offload_bytes > 0 && region.offload_bytes > 0 &&
                             region.offload_bytes <= UINT64_MAX - group.offload_bytes;
    group.offload_bytes = offloadable ? group.offload_bytes + region.offload_bytes : 0;
    if (group.members_offload_seconds) *group.members_offload_seconds += copies;
    if (group.must_save.empty() && !region.must_save.empty()) group.must_save = region.name + ": " + region.must_save;
    if (group.must_recompute.empty() && !region.must_recompute.empty()) {
      group.must_recompute = region.name + ": " + region.must_recompute;
    }
    if (first_saved[it->second] == nullptr && !region.must_save.empty()) first_saved[it->second] = &region;
    if (first_recomputed[it->second] == nullptr && !region.must_recompute.empty()) {
      first_recomputed[it->second] = &region;
    }
    refuse_mixed_pins(group, first_saved[it->second], first_recomputed[it->second]);
  }
  return out;
}

bool matches(std::string_view pattern, std::string_view name) {
  // '*' takes the whole run of digits where it stands, so a grouped pattern matches exactly the
  // names grouped() made it from (and their other layers): "ff*" is not "ff", "layers.*::mlp" is
  // not "layers.0.sub::mlp".
  std::size_t n = 0;
  for (const char want : pattern) {
    if (want == '*') {
      if (n == name.size() || std::isdigit(static_cast<unsigned char>(name[n])) == 0) return false;
      while (n < name.size() && std::isdigit(static_cast<unsigned char>(name[n])) != 0) ++n;
    } else if (n < name.size() && name[n] == want) {
      ++n;
    } else {
      return false;
    }
  }
  return n == name.size();
}

RegionChoices::RegionChoices(std::vector<std::pair<std::string, Choice>> choices,
                             const std::vector<std::string>& offloaded)
    : choices_(std::move(choices)), offloaded_(choices_.size(), false) {
  for (const std::string& name : offloaded) {
    const auto entry = std::find_if(choices_.begin(), choices_.end(), [&](const auto& c) { return c.first == name; });
    if (entry == choices_.end()) {
      throw BudgetError("the plan offloads '" + name + "', which it makes no choice for; offload only regions the "
                        "plan names, with the choice save");
    }
    if (entry->second != Choice::save) {
      throw BudgetError("the plan offloads '" + name + "', which it recomputes; an offloaded region runs saved: "
                        "make its choice save, or do not offload it");
    }
    offloaded_[static_cast<std::size_t>(entry - choices_.begin())] = true;
  }
}

namespace {

std::vector<std::pair<std::string, Choice>> named_choices_of(const Plan& plan) {
  std::vector<std::pair<std::string, Choice>> choices;
  choices.reserve(plan.regions.size());
  for (const auto& [region, choice] : plan.regions) choices.emplace_back(region.name, choice);
  return choices;
}

std::vector<std::string> offloaded_of(const Plan& plan) {
  std::vector<std::string> offloaded;
  for (std::size_t r = 0; r < plan.offloaded.size() && r < plan.regions.size(); ++r) {
    if (plan.offloaded[r]) offloaded.push_back(plan.regions[r].first.name);
  }
  return offloaded;
}

}  // namespace

RegionChoices::RegionChoices(const Plan& plan) : RegionChoices(named_choices_of(plan), offloaded_of(plan)) {
  if (plan.kept_ops.empty()) return;
  kept_ops_.resize(choices_.size());
  for (std::size_t r = 0; r < plan.kept_ops.size() && r < plan.regions.size(); ++r) {
    if (!plan.kept_ops[r].empty() && plan.regions[r].second != Choice::recompute) {
      throw BudgetError("the plan keeps ops of '" + plan.regions[r].first.name +
                        "', which it saves; a region keeps "
                        "ops only while it recomputes: make its choice recompute, or drop its kept_ops");
    }
    for (const OpCost& op : plan.kept_ops[r]) kept_ops_[r].emplace(op.index, op.op);
  }
}

const std::map<std::uint32_t, std::string>* RegionChoices::kept_ops_for(std::string_view region) const {
  if (kept_ops_.empty()) return nullptr;
  const auto entry = entry_for(region);
  if (!entry || kept_ops_[*entry].empty()) return nullptr;
  return &kept_ops_[*entry];
}

std::optional<std::size_t> RegionChoices::entry_for(std::string_view region) const {
  for (std::size_t i = 0; i < choices_.size(); ++i) {
    if (choices_[i].first == region) return i;
  }
  for (std::size_t i = 0; i < choices_.size(); ++i) {
    const std::string& name = choices_[i].first;
    if (name.find('*') != std::string::npos && matches(name, region)) return i;
  }
  return std::nullopt;
}

std::optional<Choice> RegionChoices::choice_for(std::string_view region) const {
  const auto entry = entry_for(region);
  if (!entry) return std::nullopt;
  return choices_[*entry].second;
}

bool RegionChoices::offloads(std::string_view region) const {
  if (!offloads_any()) return false;
  const auto entry = entry_for(region);
  return entry && offloaded_[*entry];
}

bool RegionChoices::offloads_any() const {
  return std::find(offloaded_.begin(), offloaded_.end(), true) != offloaded_.end();
}

}  // namespace remat::budget
