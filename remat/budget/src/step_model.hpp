#pragma once
// A plan's device bytes through the step, from the one profiled step (step_peak.hpp): each
// segment's measured peak less what the plan's checkpoints no longer keep of what was alive in it,
// plus what recompute and the offloader bring back there. Built once per profile; peak() is asked
// once per plan a solver weighs.

#include <remat/budget/plan.hpp>

#include "made_again.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace remat::budget::detail {

// The profile region each step region takes its choice from (by exact name, else the first
// pattern that matches); throws BudgetError for a step region the profile does not list.
std::vector<std::vector<std::size_t>> region_indexes(const RegionProfile& profile, const StepMemory& step);

// The profile's step memory; throws BudgetError naming how to profile it where there is none.
const StepMemory& step_of(const RegionProfile& profile);

// Throws the BudgetError of a peak budget below every plan's: it names the least peak (`among`:
// where that least is only among the plans tried, says so) and what stays allocated through it.
[[noreturn]] void refuse_peak(const StepMemory& step, std::uint64_t peak_bytes, std::uint64_t lowest_peak,
                              const std::string& among);

// A plan by step peak's own figures: what it keeps is its budget of kept bytes; `exact`: proved
// the fastest within peak_bytes (least_recompute_seconds its own, else no bound: 0); peak_bytes
// the budget, `peak` its predicted peak.
void finish_peak_plan(Plan& plan, bool exact, std::uint64_t peak_bytes, std::uint64_t peak);

class StepModel {
 public:
  StepModel(const RegionProfile& profile, const StepMemory& step);

  // The predicted step peak with `choices` (one per region of the profile, in its order),
  // `offloaded` (empty: none; else one per region, true for a region saved and offloaded) and
  // `kept_ops` (none, or the ops each recomputed region keeps).
  std::uint64_t peak(const std::vector<Choice>& choices, const std::vector<bool>& offloaded = {},
                     const KeptOps* kept_ops = nullptr);

 private:
  // Where offloaded regions' bytes are on the device, per checkpoint call (step_model.cpp says when).
  struct Offload {
    std::vector<std::uint64_t> back_bytes;              // brought back: the offloaded regions' offload_bytes
    std::vector<std::size_t> back_from;                 // the first segment they are back in
    std::vector<std::vector<std::uint32_t>> lingering;  // CUDA: still on the device after forward
    std::vector<std::size_t> linger_until;              // until this segment (the next pack settles them)
  };

  std::vector<std::vector<std::uint32_t>> kept_sets(const std::vector<Choice>& choices,
                                                    const std::vector<bool>& offloaded, const KeptOps* kept_ops) const;
  std::vector<std::uint32_t> kept_set(std::size_t k, const std::vector<Choice>& choices,
                                      const std::vector<bool>& offloaded, const KeptOps* kept_ops) const;
  // Adds to `outputs` the storages the ops `kept` of region r of call k made.
  void add_kept_op_outputs(std::size_t k, std::size_t r, const std::vector<std::uint32_t>& kept,
                           std::vector<std::uint32_t>& outputs) const;
  // In a segment of call k's forward, the kept ops' storages of its regions that have returned.
  std::vector<std::uint32_t> kept_in_forward(std::size_t s, const std::vector<Choice>& choices,
                                             const KeptOps& kept_ops) const;
  std::vector<std::uint32_t> recomputed_saved(std::size_t k, const std::vector<Choice>& choices) const;
  std::uint64_t recompute_transient(std::size_t k, const std::vector<Choice>& choices) const;
  Offload offload_of(const std::vector<bool>& offloaded) const;
  // Per segment, the bytes alive because of checkpoints (step_model.cpp says which), walked once
  // through the step: `sets` is what each call keeps, `in_own_backward` (where given) what it keeps
  // while its own backward runs, and `also_alive(s, ids)` lists what else segment s holds.
  // `made` (where given) which of made_again_ the plan makes.
  std::vector<std::uint64_t> alive_by_segment(
      const std::vector<std::vector<std::uint32_t>>& sets,
      const std::vector<std::vector<std::uint32_t>>* in_own_backward,
      const std::function<void(std::size_t, std::vector<std::uint32_t>&)>& also_alive, const Offload* offload,
      const std::vector<char>* made);

  const RegionProfile& profile_;
  const StepMemory& step_;
  bool cuda_ = false;
  std::vector<std::vector<std::size_t>> indexes_;
  std::vector<std::vector<std::pair<std::uint32_t, std::int64_t>>> held_until_;
  std::vector<std::size_t> first_backward_;  // per call: its first backward segment (none: segments' count)
  std::vector<std::size_t> forward_end_;     // per call: the segment after its last forward one
  // Per segment of a call's forward: how many of that call's forward segments came before it. The
  // profile cuts a call's forward at each region's entry and exit, so region r has returned from
  // the segment numbered 2r + 2 on.
  std::vector<std::size_t> forward_place_;
  // The casts autocast's cache holds (regions' autocast_cached), by call and the segment that
  // frees them (the first clear after their region began)
  struct HeldCasts {
    std::uint32_t call = 0;
    std::size_t until = 0;
    std::vector<std::uint32_t> ids;
  };
  std::vector<HeldCasts> casts_;
  std::vector<std::vector<std::uint32_t>> casts_of_call_;  // per call: its entries in casts_
  std::vector<std::vector<std::uint32_t>> uncaching_;      // per segment: the entries it frees
  MadeAgainSet made_again_;
  std::vector<std::size_t> kept_count_;              // per call: its regions' kept storages, counted
  // The regions whose outputs include each storage, as (call, region in it): those of storage id
  // are makers_[makers_begin_[id] .. makers_begin_[id + 1]).
  std::vector<std::size_t> makers_begin_;
  std::vector<std::pair<std::size_t, std::size_t>> makers_;
  std::vector<std::vector<std::uint32_t>> saved_sets_;
  // Per segment: the calls live there that were not in the segment before, and those no longer live.
  std::vector<std::vector<std::uint32_t>> joining_;
  std::vector<std::vector<std::uint32_t>> leaving_;
  // Per call: the outputs it consumes that held_until_ lists, as (holder call, entry in its list).
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> consumed_;
  // Per held_until_ entry: the segment from which code outside holds it no longer, where the
  // profiled step freed it (freed_in) and no region of its call keeps it (segments' count: never).
  std::vector<std::vector<std::size_t>> held_freed_;
  // Per segment: the held_until_ entries held_freed_ ends there, as (holder call, entry in its list).
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> unholding_;
  std::vector<std::uint64_t> saved_alive_;
};

}  // namespace remat::budget::detail
