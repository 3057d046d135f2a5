#pragma once
// Budget plans: which regions of the checkpoints to save and which to recompute, chosen from the
// bytes and times one training step measured (a region profile), so that what the checkpoints
// keep fits a memory budget and recompute costs the least time. The solver is a 0/1 knapsack,
// proved optimal wherever it can be within a fraction of a second. Standard C++, no LibTorch: the
// Python package, the checkpoint runtime and remat-report all plan with it, and read and write
// the same dumps (schemas/region-profile and schemas/remat-plan).

#include <remat/budget/error.hpp>
#include <remat/budget/step_peak.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace remat::budget {

// One ATen op of a region whose output a plan may keep while the region recomputes: recompute
// then takes the kept output instead of running the op again (op_plan.hpp).
struct OpCost {
  std::uint32_t index = 0;  // its place among every op the region runs, from 0
  std::string op;           // the ATen op's name, "aten::mm"
  std::uint64_t bytes = 0;  // its outputs' storages
  double seconds = 0;       // its time in the profiled forward
};

// What one region costs: the bytes its checkpoint keeps for backward while it is saved, and
// its forward time, which recompute spends again when it is not.
struct RegionCost {
  std::string name;  // "checkpoint::region"; in a grouped profile, a pattern ("layers.*::attn")
  std::uint64_t saved_bytes = 0;
  double seconds = 0;
  std::uint64_t count = 1;  // the regions it stands for
  // Per-op figures (profiles taken with them; absent from grouped ones): the ops whose outputs a
  // plan may keep, in the order the region ran them, and the time watching the region's ops
  // adds to one run of it (a plan that keeps ops pays it in forward and again in recompute).
  std::vector<OpCost> ops;
  double op_overhead_seconds = 0;
  // Why the region must be saved, where its recompute would not give back what its forward gave
  // (it draws from a generator of its own, it writes into state it did not make: a BatchNorm's
  // running statistics, a cache); empty where it may recompute. Every plan saves such a region.
  std::string must_save;
  // Why the region must be recomputed, where saving it gains nothing: its checkpoint would run it
  // again in recompute all the same (it changes its input in place, or its output is changed in
  // place after it returns, so skipping it would miss or repeat the change); empty where it may be
  // saved. Every plan recomputes such a region. Never set with must_save.
  std::string must_recompute;
  // The bytes offloading the region would move to the host and back (profiles with copy figures;
  // 0: not offloadable), and in a plan that offloads it, what the copies cost the step
  // (offload_seconds(), offload_plan.hpp).
  std::uint64_t offload_bytes = 0;
  double offload_seconds = 0;
  // A group of grouped() over a profile with copy figures: what offloading every region it stands
  // for costs, priced region by region and added up (a GPU overlaps each region's copies with that
  // region's own forward, so a price from the group's sums would be too low). Unset elsewhere.
  std::optional<double> members_offload_seconds;
};

// The copy bandwidth a profile measured (host memory on the CPU, pinned host memory on a GPU), in
// bytes a second each way: what offload plans price a region's copies by.
struct HostCopy {
  double to_host_bytes_per_second = 0;    // more than 0
  double to_device_bytes_per_second = 0;  // more than 0
  std::uint64_t measured_bytes = 0;       // the size of the copy timed
};

struct RegionProfile {
  // What the checkpoints keep with every region recomputed: their inputs.
  std::uint64_t base_bytes = 0;
  std::vector<RegionCost> regions;  // in the order the step ran them
  std::string device;               // where the step ran: "cpu", "cuda:0"
  std::string timer;                // how seconds were measured: "thread_time", "cuda_events"
  // The whole step's memory (absent from a profile taken without a counting allocator, and from
  // older dumps): what plans by step peak are predicted from.
  std::optional<StepMemory> step;
  // The copy bandwidth (profiles that measured it): offload plans need it (offload_plan.hpp).
  std::optional<HostCopy> host_copy;

  // base_bytes and every region saved.
  std::uint64_t all_saved_bytes() const;
};

enum class Choice : std::uint8_t { save, recompute };
std::string_view to_string(Choice choice);

struct Plan {
  std::uint64_t budget_bytes = 0;
  std::uint64_t base_bytes = 0;
  std::uint64_t kept_bytes = 0;  // base_bytes and the saved regions' bytes
  double recompute_seconds = 0;  // the recomputed regions' seconds
  // The solver proved the plan optimal; false only when a profile was too large to search to
  // the end (the plan then fits the budget but may recompute more than it must, at most
  // recompute_seconds - least_recompute_seconds more).
  bool exact = true;
  double least_recompute_seconds = 0;  // no plan within the budget recomputes less
  // Each region with its cost and choice, in profile order (patterns in a grouped plan).
  std::vector<std::pair<RegionCost, Choice>> regions;
  // A per-op plan (solve_ops): for each entry of regions, the ops whose outputs a recomputed
  // region keeps (empty for the others); empty for a plan by regions alone. kept_bytes counts
  // their bytes, recompute_seconds spares their seconds and pays the regions' op overhead.
  std::vector<std::vector<OpCost>> kept_ops;
  // A plan by step peak (solve_peak): the peak asked for and the one predicted; 0 otherwise.
  std::uint64_t peak_budget_bytes = 0;
  std::uint64_t peak_bytes = 0;
  // A plan with a host budget (solve_offload): for each entry of regions, whether it is offloaded
  // (its choice is then save: the runtime keeps it and the offloader moves it to the host); empty
  // for a plan without offload. host_bytes adds up the offloaded regions' offload_bytes,
  // offload_seconds their copies' cost (part of recompute_seconds).
  std::vector<bool> offloaded;
  std::optional<std::uint64_t> host_budget_bytes;
  std::uint64_t host_bytes = 0;
  double offload_seconds = 0;
};

// Throws BudgetError naming the region where the profile's seconds, added up in order, pass the
// largest double: no plan that recomputes them all could report its recompute_seconds.
void check_seconds_add_up(const RegionProfile& profile);

// The plan that recomputes the fewest seconds with base_bytes plus the saved regions' bytes at
// most `budget_bytes`. Throws BudgetError for a budget below least_kept_bytes, naming that minimum.
Plan solve(const RegionProfile& profile, std::uint64_t budget_bytes);

// What every plan keeps: base_bytes and the bytes of the regions that must be saved.
std::uint64_t least_kept_bytes(const RegionProfile& profile);

// The fastest plan at `steps` budgets spread evenly from least_kept_bytes to everything saved
// (at least 2: both ends; fewer where the range holds fewer distinct budgets).
std::vector<Plan> frontier(const RegionProfile& profile, std::size_t steps);

// The profile with regions whose names differ only in their numbers made one: every run of
// digits becomes '*' ("layers.0::attn" and "layers.1::attn" are "layers.*::attn"), bytes and
// seconds added up, in order of first appearance. A group is offloadable where each of its regions
// is (offload_bytes added up, else 0), its copies priced region by region (members_offload_seconds).
// A group takes any member's must_save or must_recompute; one with a region that must be saved and
// another that must be recomputed has no choice for both: BudgetError naming the pattern, both
// regions and their reasons.
RegionProfile grouped(const RegionProfile& profile);

// Whether `name` matches `pattern`, where each '*' stands for a number: the whole run of digits
// at its place ("layers.*::ff*" matches "layers.12::ff2", not "layers.12::ff" or
// "layers.1.sub::ff2").
bool matches(std::string_view pattern, std::string_view name);

// A plan's choices, looked up by region name: an exact name first, then the first pattern that
// matches. An entry may also offload its regions: they run saved, and the checkpoint runtime keeps
// what they save through the plan's offloader (remat::plan_offloader), on the host.
class RegionChoices {
 public:
  // `offloaded`: entries of `choices` whose regions are offloaded; each must be saved there
  // (BudgetError naming it otherwise).
  explicit RegionChoices(std::vector<std::pair<std::string, Choice>> choices,
                         const std::vector<std::string>& offloaded = {});
  // A plan's choices (solve, solve_offload, solve_ops, plan_from_json...), its offloaded regions
  // and the ops a per-op plan keeps in recomputed regions included.
  explicit RegionChoices(const Plan& plan);
  std::optional<Choice> choice_for(std::string_view region) const;
  // The ops the entry `region` takes its choice from keeps while it recomputes ({index: ATen op
  // name}; remat/kept_ops.hpp carries them out), or null where it keeps none.
  const std::map<std::uint32_t, std::string>* kept_ops_for(std::string_view region) const;
  // Whether the entry `region` takes its choice from offloads it.
  bool offloads(std::string_view region) const;
  bool offloads_any() const;
  const std::vector<std::pair<std::string, Choice>>& entries() const { return choices_; }

 private:
  // The entry `region` takes its choice from, or none.
  std::optional<std::size_t> entry_for(std::string_view region) const;

  std::vector<std::pair<std::string, Choice>> choices_;
  std::vector<bool> offloaded_;                                 // by entry
  std::vector<std::map<std::uint32_t, std::string>> kept_ops_;  // by entry; empty for a plan by regions
};

// Dumps (kind "region-profile" and "remat-plan", with the common header; dumps written before kinds
// were kebab-case spell them region_profile and remat_plan, and still read). The readers check
// every field and throw BudgetError naming `source`, the field's path and the fix.
std::string profile_to_json(const RegionProfile& profile);
RegionProfile profile_from_json(std::string_view text, std::string_view source);
std::string plan_to_json(const Plan& plan);
Plan plan_from_json(std::string_view text, std::string_view source);

inline constexpr int kProfileSchemaVersion = 1;
inline constexpr int kPlanSchemaVersion = 1;

}  // namespace remat::budget
