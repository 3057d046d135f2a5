#pragma once
// Ways a runtime could hand out receive slots, for the ring simulator: the plan's slots in
// the plan's ring, the plan's slots squeezed into one slot fewer, first free slot in a ring
// of a given size, and NeMo's microbatch-modulo-ring.

#include "ring_simulator.hpp"

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/plan.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace remat::pipeline::testing {

inline const StagePlan& plan_entry(const PipelinePlan& plan, int stage, Direction direction) {
  for (const StagePlan& entry : plan.entries)
    if (entry.stage == stage && entry.direction == direction) return entry;
  throw PlanError("the plan has no entry for stage " + std::to_string(stage));
}

inline int first_free(const std::vector<bool>& live) {
  for (std::size_t slot = 0; slot < live.size(); ++slot)
    if (!live[slot]) return static_cast<int>(slot);
  return 0;  // none free: take slot 0 anyway, and let the simulator see the clash
}

// The runtime as planned: slot = the planned slot, ring = ring_size.
inline RingPolicy planned_ring(const PipelinePlan& plan) {
  return {[&plan](int stage, Direction d) { return *plan_entry(plan, stage, d).ring_size; },
          [&plan](int stage, Direction d, int mb, const std::vector<bool>&) {
            return *plan_entry(plan, stage, d).slots[static_cast<std::size_t>(mb)];
          }};
}

// One slot fewer than the colored minimum everywhere it is 2 or more: planned slot modulo
// (minimum - 1).
inline RingPolicy squeezed_planned_ring(const PipelinePlan& plan) {
  const auto size = [&plan](int stage, Direction d) {
    const StagePlan& e = plan_entry(plan, stage, d);
    return e.min_slots >= 2 ? e.min_slots - 1 : e.min_slots;
  };
  return {size, [&plan, size](int stage, Direction d, int mb, const std::vector<bool>&) {
            return *plan_entry(plan, stage, d).slots[static_cast<std::size_t>(mb)] % size(stage, d);
          }};
}

// Slots taken as they free up, in a ring of `size(stage, direction)`.
inline RingPolicy first_free_ring(std::function<int(int, Direction)> size) {
  return {std::move(size), [](int, Direction, int, const std::vector<bool>& live) { return first_free(live); }};
}

// NeMo's recv_buffer_pool: microbatch m uses set m % K, K its closed form.
inline RingPolicy nemo_ring(const PipelinePlan& plan) {
  const auto size = [&plan](int stage, Direction d) { return plan_entry(plan, stage, d).closed_form->size; };
  return {size, [size](int stage, Direction d, int mb, const std::vector<bool>&) { return mb % size(stage, d); }};
}

}  // namespace remat::pipeline::testing
