// The ring simulator runs lowered schedules with receive buffers drawn from rings: the plan's
// rings never hand out a live slot, one slot fewer than the colored minimum always does, and
// NeMo's ring clashes exactly where the plan calls it unsafe. Hand-written schedules here;
// every generated schedule on a grid in test_simulator_grid.cpp.

#include "ring_policies.hpp"
#include "ring_simulator.hpp"
#include "schedule_rows.hpp"

#include <remat/pipeline/plan.hpp>

#include <gtest/gtest.h>

namespace remat::pipeline {
namespace {

using testing::schedule_from_rows;
using testing::simulate;

PipelinePlan plan_of(const Schedule& lowered, const std::string& name, int slack = 2) {
  PlanOptions options;
  options.schedule_name = name;
  options.slack = slack;
  return plan_receive_buffers(lowered, options);
}

// Every (stage, direction) whose colored minimum is 2 or more clashes with one slot fewer;
// the others do not.
void expect_clash_where_squeezed(const Schedule& lowered, const PipelinePlan& plan) {
  const testing::SimulationResult squeezed = simulate(lowered, testing::squeezed_planned_ring(plan));
  const testing::SimulationResult first_free = simulate(lowered, testing::first_free_ring([&plan](int s, Direction d) {
                                                          const int min = testing::plan_entry(plan, s, d).min_slots;
                                                          return min >= 2 ? min - 1 : min;
                                                        }));
  EXPECT_TRUE(squeezed.errors.empty()) << squeezed.first_problem();
  for (const StagePlan& e : plan.entries) {
    EXPECT_EQ(squeezed.clashes_on(e.stage, e.direction), e.min_slots >= 2) << e.stage << to_string(e.direction);
    EXPECT_EQ(first_free.clashes_on(e.stage, e.direction), e.min_slots >= 2) << e.stage << to_string(e.direction);
  }
}

TEST(RingSimulator, PlannedRingsRunOneFOneBWithoutHandingOutALiveSlot) {
  const Schedule lowered = testing::one_f_one_b_3x4();
  for (const int slack : {0, 1, 2}) {
    const PipelinePlan plan = plan_of(lowered, "1f1b", slack);
    const testing::SimulationResult result = simulate(lowered, testing::planned_ring(plan));
    EXPECT_TRUE(result.clean()) << "slack " << slack << ": " << result.first_problem();
    EXPECT_EQ(result.steps, 16 + 24 + 16);
  }
}

TEST(RingSimulator, OneSlotFewerThanTheColoredMinimumClashes) {
  const Schedule lowered = testing::one_f_one_b_3x4();
  expect_clash_where_squeezed(lowered, plan_of(lowered, "1f1b"));
  expect_clash_where_squeezed(testing::gpipe_2x3(), plan_of(testing::gpipe_2x3(), "gpipe"));
}

TEST(RingSimulator, NemosRingClashesExactlyWhereThePlanCallsItUnsafe) {
  const Schedule lowered = testing::one_f_one_b_3x4();
  for (const int slack : {0, 1, 2}) {
    const PipelinePlan plan = plan_of(lowered, "1f1b", slack);
    const testing::SimulationResult result = simulate(lowered, testing::nemo_ring(plan));
    for (const StagePlan& e : plan.entries) {
      if (!e.closed_form) continue;
      EXPECT_EQ(result.clashes_on(e.stage, e.direction), !e.closed_form->safe)
          << "slack " << slack << " stage " << e.stage << to_string(e.direction);
    }
  }
  // Slack 0: stage 1's two-set ring reuses microbatch 0's activations before its backward.
  const testing::SimulationResult slack0 = simulate(lowered, testing::nemo_ring(plan_of(lowered, "1f1b", 0)));
  ASSERT_FALSE(slack0.clashes.empty());
  EXPECT_EQ(slack0.clashes.front().text,
            "rank 1 position 7 1RECV_F2 takes slot 0 while microbatch 0 still has 1 reader(s) to run");
}

TEST(RingSimulator, TheWeightGradientsReadIsHonoured) {
  const Schedule zero_bubble = schedule_from_rows({"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0RECV_B1,0I1,0W0,0W1",
                                                   "1RECV_F0,1F0,1I0,1SEND_B0,1RECV_F1,1F1,1I1,1SEND_B1,1W0,1W1"},
                                                  {0, 1}, 2);
  const PipelinePlan plan = plan_of(zero_bubble, "");
  EXPECT_TRUE(simulate(zero_bubble, testing::planned_ring(plan)).clean());
  const testing::SimulationResult one_set =
      simulate(zero_bubble, testing::first_free_ring([](int, Direction) { return 1; }));
  EXPECT_TRUE(one_set.clashes_on(1, Direction::forward)) << one_set.first_problem();
  // Stage 0 runs its whole backward at W from the received gradient, so one set is one short there too.
  EXPECT_TRUE(one_set.clashes_on(0, Direction::backward));
}

TEST(RingSimulator, ASendAfterItsRecvDeadlocks) {
  const Schedule stuck = schedule_from_rows({"0RECV_B0,0F0,0SEND_F0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"}, {0, 1}, 1);
  const testing::SimulationResult result = simulate(stuck, testing::first_free_ring([](int, Direction) { return 1; }));
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0], "deadlock: rank 0 at 0RECV_B0 rank 1 at 1RECV_F0");
}

TEST(RingSimulator, AComputeBeforeItsInputArrivesIsAnError) {
  const Schedule early = schedule_from_rows({"0F0,0SEND_F0,0RECV_B0,0B0", "1F0,1RECV_F0,1B0,1SEND_B0"}, {0, 1}, 1);
  const testing::SimulationResult result = simulate(early, testing::first_free_ring([](int, Direction) { return 1; }));
  ASSERT_FALSE(result.errors.empty());
  EXPECT_EQ(result.errors[0], "rank 1 position 0 1F0: runs before its input");
}

}  // namespace
}  // namespace remat::pipeline
