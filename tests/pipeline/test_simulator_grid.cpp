// Every generated schedule on a grid (ranks 2-8, virtual stages 1-4 where the schedule takes
// them, microbatches 1-64), lowered both ways PyTorch does, runs in the ring simulator:
// - with the plan's rings, no slot is handed out while its holder is live;
// - with one slot fewer than the colored minimum (the planned slot modulo min - 1, and first
//   free slot in a ring of min - 1), every stage whose minimum is 2 or more clashes;
// - for 1F1B, NeMo's microbatch-modulo-K ring clashes exactly where the plan says unsafe.

#include "ring_policies.hpp"
#include "ring_simulator.hpp"

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/plan.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace remat::pipeline {
namespace {

const int kMicrobatches[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 32, 48, 63, 64};

struct Coverage {
  int shapes = 0;
  int negative_controls = 0;  // (stage, direction) entries whose clash was caught
  std::set<int> ranks, virtual_stages, microbatches;
};

std::vector<int> virtual_stage_counts(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return {1};
    case ScheduleKind::zbv_zero_bubble:
    case ScheduleKind::dualpipev: return {2};
    default: return {1, 2, 3, 4};
  }
}

std::string shape_text(ScheduleKind kind, int ranks, int v, int m, const char* lowering) {
  return std::string(to_string(kind)) + " R=" + std::to_string(ranks) + " V=" + std::to_string(v) +
         " M=" + std::to_string(m) + " (" + lowering + ")";
}

int squeezed(const StagePlan& e) { return e.min_slots >= 2 ? e.min_slots - 1 : e.min_slots; }

void check(const Schedule& lowered, ScheduleKind kind, const std::string& shape, Coverage& coverage) {
  PlanOptions options;
  options.schedule_name = std::string(to_string(kind));
  const PipelinePlan plan = plan_receive_buffers(lowered, options);

  const testing::SimulationResult planned = testing::simulate(lowered, testing::planned_ring(plan));
  ASSERT_TRUE(planned.clean()) << shape << ": " << planned.first_problem();

  const testing::SimulationResult mod = testing::simulate(lowered, testing::squeezed_planned_ring(plan));
  const testing::SimulationResult first_free = testing::simulate(
      lowered,
      testing::first_free_ring([&plan](int s, Direction d) { return squeezed(testing::plan_entry(plan, s, d)); }));
  ASSERT_TRUE(mod.errors.empty() && first_free.errors.empty()) << shape;
  for (const StagePlan& e : plan.entries) {
    const bool must_clash = e.min_slots >= 2;
    ASSERT_EQ(mod.clashes_on(e.stage, e.direction), must_clash)
        << shape << " stage " << e.stage << to_string(e.direction) << " min " << e.min_slots;
    ASSERT_EQ(first_free.clashes_on(e.stage, e.direction), must_clash)
        << shape << " stage " << e.stage << to_string(e.direction) << " min " << e.min_slots;
    coverage.negative_controls += must_clash;
  }

  if (kind != ScheduleKind::one_f_one_b) return;
  for (const int slack : {0, 1, 2}) {
    options.slack = slack;
    const PipelinePlan nemo_plan = plan_receive_buffers(lowered, options);
    const testing::SimulationResult nemo = testing::simulate(lowered, testing::nemo_ring(nemo_plan));
    for (const StagePlan& e : nemo_plan.entries) {
      if (!e.closed_form) continue;
      ASSERT_EQ(nemo.clashes_on(e.stage, e.direction), !e.closed_form->safe)
          << shape << " slack " << slack << " stage " << e.stage << to_string(e.direction);
    }
  }
}

TEST(RingSimulatorGrid, EveryScheduleRunsOnItsPlannedRingsAndClashesWithOneSlotFewer) {
  std::map<ScheduleKind, Coverage> coverage;
  for (const ScheduleKind kind : all_schedule_kinds()) {
    for (int ranks = 2; ranks <= 8; ++ranks) {
      for (const int v : virtual_stage_counts(kind)) {
        for (const int m : kMicrobatches) {
          Schedule compute;
          try {
            compute = generate_schedule(kind, {ranks, v, m});
          } catch (const PlanError&) {
            continue;  // a shape PyTorch refuses
          }
          Coverage& c = coverage[kind];
          ++c.shapes;
          c.ranks.insert(ranks);
          c.virtual_stages.insert(v);
          c.microbatches.insert(m);
          check(lower_schedule(compute), kind, shape_text(kind, ranks, v, m, "add-send-recv"), c);
          check(lower_schedule_for_runtime(compute), kind, shape_text(kind, ranks, v, m, "runtime"), c);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
  for (const ScheduleKind kind : all_schedule_kinds()) {
    const Coverage& c = coverage[kind];
    SCOPED_TRACE(std::string(to_string(kind)));
    EXPECT_GE(c.shapes, 20);
    EXPECT_GT(c.negative_controls, 0);  // a clash caught for every schedule
    EXPECT_EQ(c.ranks, (std::set<int>{2, 3, 4, 5, 6, 7, 8}));
    EXPECT_EQ(c.virtual_stages.size(), virtual_stage_counts(kind).size());
    EXPECT_TRUE(c.microbatches.count(64));
    std::printf("%-24s %4d shapes x 2 lowerings, %5d stage rings caught one slot short\n",
                std::string(to_string(kind)).c_str(), c.shapes, c.negative_controls);
  }
}

}  // namespace
}  // namespace remat::pipeline
