#pragma once
// The step-peak tests' smallest step: two checkpoints of one region each. c0 makes out0 (100 bytes)
// and saves s0 (10); c1 takes out0, makes out1 (100) and saves s1 (10). Segments: the end of
// forward (220 bytes allocated), c1's backward (peak 300), c0's backward (peak 200).

#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

namespace remat::budget::fixtures {

inline RegionProfile two_checkpoints() {
  RegionProfile profile;
  profile.regions = {{"c0::r", 110, 1.0, 1}, {"c1::r", 110, 2.0, 1}};
  StepMemory step;
  step.peak_bytes = 300;
  step.storages = {100, 10, 100, 10};  // out0, s0, out1, s1
  step.checkpoints = {{"c0", {}, {}, {0}, {{"c0::r", {0, 1}, {}, {0}, 0}}},
                      {"c1", {0}, {}, {2}, {{"c1::r", {2, 3}, {0}, {2}, 0}}}};
  step.segments = {{220, 0, {0, 1}, -1, -1}, {300, 220, {0, 1}, -1, 1}, {200, 110, {0}, -1, 0}};
  profile.step = step;
  return profile;
}

}  // namespace remat::budget::fixtures
