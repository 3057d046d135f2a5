#pragma once
// A training step's peak, predicted for any plan from one profiled step. The profile (run with
// every region saved) cuts the step's allocated bytes into segments and records, as sets of
// storages, what each checkpoint call keeps: a plan's peak is each segment's measured peak less
// the bytes of what was alive in it that the plan's checkpoints no longer keep, plus, where a
// checkpoint's backward recomputes regions, the largest forward transient among them. Sets, not
// sums: a storage that is one checkpoint's output and the next one's input counts once.

#include <remat/budget/error.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace remat::budget {

struct RegionProfile;
struct Plan;
enum class Choice : std::uint8_t;

// Storages are numbered in StepMemory::storages (their bytes); sets are lists of those numbers.

// One op a per-op plan may keep (RegionCost::ops, by its index), as this call of its region ran it.
struct StepOp {
  std::uint32_t index = 0;             // its index among the region's ops, as in OpCost::index
  std::vector<std::uint32_t> outputs;  // the storages its outputs are
};

struct StepRegion {
  std::string name;                    // "checkpoint::region", as in RegionProfile::regions
  std::vector<std::uint32_t> kept;     // what it keeps while saved (saved tensors, its output)
  std::vector<std::uint32_t> inputs;   // its tensor inputs
  std::vector<std::uint32_t> outputs;  // its tensor outputs
  std::uint64_t transient_bytes = 0;   // forward's peak inside it over what it leaves allocated
  // Of `kept`, what stays on the device when the region is offloaded: tensors remat.CpuOffload
  // leaves as they are (not dense: a slice of a wider tensor; a parameter or a view of one).
  std::vector<std::uint32_t> offload_kept;
  // Profiles with per-op figures: the ops of the region a plan may keep, each with the storages it
  // made. A recomputed region keeping some of them keeps those storages from forward to backward.
  std::vector<StepOp> ops;
  // Of `kept`, the casts of leaves (parameters' weights cast to bfloat16, say) autocast's cast cache
  // holds until its block ends: alive whatever the plan until the cache was cleared after the
  // region began (StepMemory::autocast_cleared), or where the profile saw no clear, until the
  // step's backward begins (or through it: StepMemory::autocast_held_in_backward).
  std::vector<std::uint32_t> autocast_cached;
  // Where its call's backward ran with create_graph=True: of `kept`, what its ops saved (its
  // outputs only where an op saved them). The graph that backward makes holds recompute's copies of
  // them (StepCheckpoint::create_graph_backwards).
  std::vector<std::uint32_t> saved;
};

struct StepCheckpoint {  // one call of a checkpoint
  std::string name;
  std::vector<std::uint32_t> inputs;  // the tensors it was called with that the step made
  std::vector<std::uint32_t>
      kept_inputs;  // those the runtime keeps with every region saved (code outside regions reads them)
  std::vector<std::uint32_t> outputs;
  std::vector<StepRegion> regions;
  // Of `inputs`, those code outside its regions reads (the runtime notes reads in a profiled step):
  // where a plan recomputes a region of the call, recompute runs that code again, so the runtime
  // keeps them. Unknown in older dumps: there every input counts as read where a recomputed region
  // takes what that code made.
  std::optional<std::vector<std::uint32_t>> body_inputs;
  // Its backwards run with create_graph=True (a gradient penalty), in order, each as the segment
  // its own backward began in and the one that whole backward ended in: the graph each made holds
  // what the regions' ops saved (StepRegion::saved) where recompute made it there, until the
  // profiled step freed it; a later backward recomputes it again beside them.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> create_graph_backwards;
};

struct StepSegment {
  std::uint64_t peak_bytes = 0;     // the highest allocated bytes in it
  std::uint64_t start_bytes = 0;    // allocated bytes when it began
  std::vector<std::uint32_t> live;  // checkpoint calls whose kept tensors are alive in it
  std::int64_t forward = -1;        // the checkpoint call whose forward runs in it, if any
  std::int64_t backward = -1;       // the checkpoint call whose backward runs in it, if any
};

struct StepMemory {
  std::uint64_t start_bytes = 0;  // allocated when the step began: parameters, optimizer state, the batch
  std::uint64_t end_bytes = 0;    // allocated when it ended (gradients added, where they were none)
  std::uint64_t peak_bytes = 0;   // the measured peak, every region saved
  std::vector<std::uint64_t> storages;
  // Per storage, the segment in which the profiled step freed it; -1 where it outlived the step or
  // where that is not known (empty: none known, as in older dumps). A call's output no later call
  // takes is held by code outside the checkpoints while the call is live, until then.
  std::vector<std::int64_t> freed_in;
  std::vector<StepCheckpoint> checkpoints;
  std::vector<StepSegment> segments;
  // The segments that begin where autocast's cast cache was cleared (its outermost block ended), in
  // order: the regions' autocast_cached casts are freed there, recomputed regions' too.
  std::vector<std::uint32_t> autocast_cleared;
  // The backward began inside the autocast block (loss.backward() under torch.autocast): where no
  // clear was seen, the cache holds the casts through the backward; where one freed a recomputed
  // region's casts before it, recompute makes them again into the cache, which holds them until the
  // next clear, through its call's backward too (counted there above the profile's peak, which
  // freed them as it used them).
  bool autocast_held_in_backward = false;
};

// Throws BudgetError naming what is inconsistent (a storage number out of range, a segment naming
// a checkpoint call that does not exist).
void check_step(const StepMemory& step, const RegionProfile& profile);

// The predicted step peak with `choices` (one per region of `profile`, in its order; a grouped
// profile's patterns apply to every region they match).
std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices);

// The same with regions offloaded (`offloaded`, one per region; an offloaded region's choice is
// save): what it keeps leaves the device after its forward and is back, as new tensors of its
// offload_bytes, from the backward of the next checkpoint call that offloads (remat.CpuOffload's
// prefetch of 1) to the end of its own call's backward; on a GPU the last region packed stays
// until the next offloading call's forward (offload_plan.hpp plans with it).
std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices,
                                const std::vector<bool>& offloaded);

// A per-op plan's kept ops, one list per region of a profile: the OpCost::index of each op whose
// outputs the region keeps while it recomputes (empty where it keeps none).
using KeptOps = std::vector<std::vector<std::uint32_t>>;

// The same for a per-op plan (op_plan.hpp): a recomputed region keeping ops keeps the storages
// they made (StepRegion::ops) from their forward to its call's backward. Throws BudgetError for a
// kept op the profile's step does not list (a step profiled without per-op figures).
std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices,
                                const KeptOps& kept_ops);

// The same for a per-op plan that offloads regions too (op_plan.hpp, solve_ops_offload).
std::uint64_t predict_step_peak(const RegionProfile& profile, const std::vector<Choice>& choices,
                                const std::vector<bool>& offloaded, const KeptOps& kept_ops);

// A plan's choice for each region, and the indices of the ops each keeps (none for a plan that
// keeps no ops), as predict_step_peak takes them.
std::vector<Choice> choices_of(const Plan& plan);
KeptOps kept_ops_of(const Plan& plan);

// The least step peak any plan reaches (among those solve_peak tries).
std::uint64_t least_step_peak(const RegionProfile& profile);

// The plan with the least recompute time whose predicted step peak is at most `peak_bytes`
// (Plan::peak_bytes). Every plan is tried where the profile has at most 16 regions (exact);
// beyond, the fastest of the plans by kept bytes (the knapsack's choice before its proof) at 17
// budgets across the range, 8 around the lowest peak among them and 8 bisecting toward the largest
// budget within the peak, and solve's plan at that budget (not proved optimal). Throws
// BudgetError naming the least peak any plan reaches and what it is made of, where none fits.
Plan solve_peak(const RegionProfile& profile, std::uint64_t peak_bytes);

}  // namespace remat::budget
