#pragma once
// Random steps for the step-peak solvers' tests against every plan: `calls` checkpoint calls in a
// chain (each takes the last one's output), each of 1 to `most_regions` regions in a chain that
// make an output and a saved storage of 1 to 400 bytes and hold a transient while they run. Each
// test adds what its solver weighs (ops, offload) to each region as it is made. Segments: each
// region's entry and exit when `forward_segments` is set, then the end of forward and each call's
// backward, last first, with peaks at or above where they begin.

#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace remat::budget::fixtures {

struct RandomStepShape {
  std::size_t calls = 1;
  std::size_t most_regions = 2;
  bool forward_segments = false;
};

// add_to_region(region, cost, step): draws the region's extras; storages it adds to `step` that
// the region does not keep count as freed within its forward.
template <class AddToRegion>
RegionProfile random_step(std::mt19937_64& rng, const RandomStepShape& shape, AddToRegion add_to_region) {
  RegionProfile profile;
  std::uniform_int_distribution<std::uint64_t> bytes(1, 400);
  std::uniform_real_distribution<double> seconds(0.0, 1.0);
  StepMemory step;
  std::int64_t previous_output = -1;
  std::uint64_t alive = 0;
  std::vector<std::uint32_t> live;
  const auto forward_segment = [&](std::uint64_t peak, std::size_t call) {
    if (shape.forward_segments) step.segments.push_back({peak, alive, live, static_cast<std::int64_t>(call), -1});
  };
  for (std::size_t k = 0; k < shape.calls; ++k) {
    StepCheckpoint call;
    call.name = "c" + std::to_string(k);
    if (previous_output >= 0) call.inputs = {static_cast<std::uint32_t>(previous_output)};
    std::int64_t carried = previous_output;
    const std::size_t regions = 1 + rng() % shape.most_regions;
    forward_segment(alive + rng() % 100, k);
    for (std::size_t r = 0; r < regions; ++r) {
      StepRegion region;
      region.name = call.name + "::r" + std::to_string(r);
      const auto output = static_cast<std::uint32_t>(step.storages.size());
      step.storages.push_back(bytes(rng));
      const auto saved = static_cast<std::uint32_t>(step.storages.size());
      step.storages.push_back(bytes(rng));
      region.kept = {output, saved};
      if (carried >= 0) region.inputs = {static_cast<std::uint32_t>(carried)};
      region.outputs = {output};
      region.transient_bytes = rng() % 200;
      RegionCost cost{region.name, step.storages[output] + step.storages[saved], seconds(rng), 1};
      if (rng() % 8 == 0) cost.must_save = "draws random numbers";
      add_to_region(region, cost, step);
      // The region's entry ends the segment before it; its own segment holds its transient.
      const std::uint64_t after = alive + step.storages[output] + step.storages[saved];
      forward_segment(after + region.transient_bytes, k);
      alive = after;
      forward_segment(alive + rng() % 100, k);
      carried = output;
      call.regions.push_back(std::move(region));
      profile.regions.push_back(std::move(cost));
    }
    call.outputs = {static_cast<std::uint32_t>(carried)};
    previous_output = carried;
    step.checkpoints.push_back(std::move(call));
    live.push_back(static_cast<std::uint32_t>(k));
  }
  step.segments.push_back({alive + rng() % 300, alive, live, -1, -1});
  for (std::size_t k = shape.calls; k-- > 0;) {
    step.segments.push_back({alive + rng() % 500, alive, live, -1, static_cast<std::int64_t>(k)});
    live.pop_back();
    for (const StepRegion& region : step.checkpoints[k].regions) {
      for (const std::uint32_t id : region.kept) alive -= step.storages[id];
    }
  }
  step.peak_bytes = 0;
  for (const StepSegment& segment : step.segments) step.peak_bytes = std::max(step.peak_bytes, segment.peak_bytes);
  profile.step = std::move(step);
  return profile;
}

// Up to 2 ops a plan may keep, drawn into a region random_step makes (none where it must be saved):
// an op's output is the region's output, its saved storage or a storage of its own (freed in the
// profiled forward); the ops' time is part of the region's.
inline void add_random_step_ops(std::mt19937_64& rng, StepRegion& region, RegionCost& cost, StepMemory& step) {
  if (!cost.must_save.empty()) return;
  std::uniform_int_distribution<std::uint64_t> bytes(1, 400);
  std::uniform_real_distribution<double> seconds(0.0, 1.0);
  const std::uint32_t output = region.kept[0], saved = region.kept[1];
  const std::size_t ops = rng() % 3;
  for (std::uint32_t o = 0; o < ops; ++o) {
    const std::uint32_t index = 2 * o + static_cast<std::uint32_t>(rng() % 2);
    std::uint32_t made = rng() % 3 == 0 ? output : rng() % 2 == 0 ? saved : 0;
    if (made == 0) {
      made = static_cast<std::uint32_t>(step.storages.size());
      step.storages.push_back(bytes(rng));
    }
    region.ops.push_back({index, {made}});
    const OpCost op{index, o % 2 == 0 ? "aten::mm" : "aten::silu", step.storages[made], 0.3 * seconds(rng)};
    cost.seconds += op.seconds;
    cost.ops.push_back(op);
  }
  cost.op_overhead_seconds = rng() % 3 == 0 ? 0 : 0.02 * seconds(rng);
}

}  // namespace remat::budget::fixtures
