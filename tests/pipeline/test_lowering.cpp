// Lowering against PyTorch 2.11: lower_schedule is _add_send_recv and
// lower_schedule_for_runtime is what _PipelineScheduleRuntime runs and dumps, each compared
// action for action and byte for byte with PyTorch's own files, and by digest over a larger
// grid; no communication between stages on one rank; deadlocks refused by name.

#include <remat/pipeline/csv.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/validate.hpp>

#include "../../pipeline/src/detail/python_int_set.hpp"
#include "reference_files.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace remat::pipeline {
namespace {

using testing::cells_of;
using testing::csv_of;
using testing::reference_cells;

Schedule from_rows(const std::vector<std::string>& rows, std::vector<int> stage_to_rank, int microbatches) {
  Schedule s;
  for (const std::string& row : rows) {
    RankOrder order;
    for (const std::string& cell : testing::split(row, ',')) order.push_back(parse_action(cell));
    s.ranks.push_back(std::move(order));
  }
  s.stage_to_rank = std::move(stage_to_rank);
  s.microbatches = microbatches;
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const PlanError& e) {
    return e.what();
  }
  return "";
}

TEST(Lowering, EveryReferenceScheduleLowersExactlyAsPyTorchsAddSendRecv) {
  for (const auto& ref : testing::reference_shapes()) {
    const Schedule lowered = lower_schedule(generate_schedule(ref.kind, ref.shape));
    EXPECT_EQ(cells_of(lowered), reference_cells(ref.compute_comms)) << ref.label();
    EXPECT_EQ(csv_of(lowered), testing::read_bytes(testing::reference_path(ref.compute_comms))) << ref.label();
  }
}

TEST(Lowering, EveryReferenceScheduleLowersForTheRuntimeExactlyAsPyTorchsPrepareScheduleWithComms) {
  for (const auto& ref : testing::reference_shapes()) {
    const Schedule lowered = lower_schedule_for_runtime(generate_schedule(ref.kind, ref.shape));
    EXPECT_EQ(cells_of(lowered), reference_cells(ref.runtime)) << ref.label();
    EXPECT_EQ(csv_of(lowered), testing::read_bytes(testing::reference_path(ref.runtime))) << ref.label();
  }
}

TEST(Lowering, GridOfShapesMatchesPyTorchDigestsInBothLowerings) {
  int compared = 0;
  for (const auto& g : testing::grid_shapes()) {
    if (g.refused) continue;
    const Schedule compute_only = generate_schedule(g.kind, g.shape);
    EXPECT_EQ(testing::fnv1a64(csv_of(lower_schedule(compute_only))), g.compute_comms) << g.label();
    EXPECT_EQ(testing::fnv1a64(csv_of(lower_schedule_for_runtime(compute_only))), g.runtime) << g.label();
    ++compared;
  }
  EXPECT_GT(compared, 1500);
}

TEST(Lowering, GPipeOnTwoRanksSendsAfterEachComputeAndReceivesInLockStep) {
  // Rank 0 idles three steps before its backwards (GPipe's timeline), long enough for rank 1
  // to send both gradients, so both RECV_B land before 0B0: idle steps take their turn.
  const Schedule lowered = lower_schedule(generate_schedule(ScheduleKind::gpipe, {2, std::nullopt, 2}));
  EXPECT_EQ(cells_of(lowered), (std::vector<std::vector<std::string>>{
                                   {"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0RECV_B1", "0B0", "0B1"},
                                   {"1RECV_F0", "1RECV_F1", "1F0", "1F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1"}}));
  EXPECT_EQ(lowered.stage_to_rank, (std::vector<int>{0, 1}));
  EXPECT_EQ(lowered.microbatches, 2);
}

TEST(Lowering, TheStepOrderIsWhatScheduleOneFOneBsLoopRuns) {
  // Schedule1F1B._step_microbatches with 3 stages and 4 microbatches: stage s warms up with
  // min(M, S - s) forwards, then one backward and one forward in turn, then the backwards.
  const Schedule lowered = lower_single_stage_step(ScheduleKind::one_f_one_b, {3, std::nullopt, 4});
  const std::vector<std::vector<std::string>> cells = cells_of(lowered);
  EXPECT_EQ(cells[0], (std::vector<std::string>{"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0F2", "0SEND_F2", "0RECV_B0",
                                                "0B0", "0F3", "0SEND_F3", "0RECV_B1", "0B1", "0RECV_B2", "0B2",
                                                "0RECV_B3", "0B3"}));
  EXPECT_EQ(cells[2], (std::vector<std::string>{"2RECV_F0", "2F0", "2B0", "2SEND_B0", "2RECV_F1", "2F1", "2B1",
                                                "2SEND_B1", "2RECV_F2", "2F2", "2B2", "2SEND_B2", "2RECV_F3", "2F3",
                                                "2B3", "2SEND_B3"}));
  EXPECT_EQ(lowered.stage_to_rank, (std::vector<int>{0, 1, 2}));
  EXPECT_NO_THROW(validate_schedule(lowered, CsvFormat::compute_comms));
}

TEST(Lowering, TheStepOrderOfGPipeRunsEveryForwardBeforeAnyBackward) {
  const Schedule lowered = lower_single_stage_step(ScheduleKind::gpipe, {2, std::nullopt, 2});
  EXPECT_EQ(cells_of(lowered), (std::vector<std::vector<std::string>>{
                                   {"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"},
                                   {"1RECV_F0", "1F0", "1RECV_F1", "1F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1"}}));
}

TEST(Lowering, TheStepOrderIsRefusedForMultiStageSchedulesAndBadShapes) {
  EXPECT_NE(error_of([] { lower_single_stage_step(ScheduleKind::interleaved_1f1b, {2, 2, 4}); })
                .find("single-stage schedules (gpipe, 1f1b)"),
            std::string::npos);
  EXPECT_NE(error_of([] { lower_single_stage_step(ScheduleKind::one_f_one_b, {4, std::nullopt, 2}); }), "");
}

TEST(Lowering, NoSendOrReceiveBetweenStagesOnTheSameRank) {
  for (const auto& g : testing::grid_shapes()) {
    if (g.refused || g.shape.ranks > 4) continue;
    const Schedule lowered = lower_schedule(generate_schedule(g.kind, g.shape));
    for (std::size_t rank = 0; rank < lowered.ranks.size(); ++rank) {
      for (const auto& step : lowered.ranks[rank]) {
        const ActionType t = step->type;
        int peer = -1;
        if (t == ActionType::send_f || t == ActionType::recv_b) peer = step->stage + 1;
        if (t == ActionType::send_b || t == ActionType::recv_f) peer = step->stage - 1;
        if (peer < 0) continue;
        EXPECT_NE(lowered.stage_to_rank[static_cast<std::size_t>(peer)], static_cast<int>(rank))
            << g.label() << ": " << to_string(*step) << " on rank " << rank;
      }
    }
  }
  // The turn of the V: stages 3 and 4 share rank 3, so 3F0 hands over in place.
  const Schedule zbv = lower_schedule(generate_schedule(ScheduleKind::zbv_zero_bubble, {4, std::nullopt, 8}));
  for (const auto& step : zbv.ranks[3]) {
    EXPECT_NE(to_string(*step), "3SEND_F0");
    EXPECT_NE(to_string(*step), "4RECV_F0");
  }
}

TEST(Lowering, EveryLoweredScheduleIsAValidComputeCommsSchedule) {
  for (const auto& g : testing::grid_shapes()) {
    if (g.refused) continue;
    const Schedule compute_only = generate_schedule(g.kind, g.shape);
    EXPECT_NO_THROW(validate_schedule(lower_schedule(compute_only), CsvFormat::compute_comms)) << g.label();
    EXPECT_NO_THROW(validate_schedule(lower_schedule_for_runtime(compute_only), CsvFormat::compute_comms)) << g.label();
  }
}

TEST(Lowering, ADeadlockIsRefusedNamingEveryStuckRanksPositionAndAction) {
  // Rank 0 waits in 0B0 for rank 1's backward; rank 1 waits in 1F1 for 0F1, which rank 0 only
  // runs after 0B0.
  const Schedule s = from_rows({"0F0,0B0,0F1,0B1", "1F0,1F1,1B0,1B1"}, {0, 1}, 2);
  const std::string message = error_of([&] { lower_schedule(s); });
  EXPECT_NE(message.find("cannot be lowered"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0, position 1, 0B0 waits for its gradient"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1, position 1, 1F1 waits for its input: 0F1 on rank 0"), std::string::npos) << message;
  EXPECT_EQ(error_of([&] { lower_schedule_for_runtime(s); }).find("cannot be lowered") != std::string::npos, true);
}

TEST(Lowering, AnOverlappedGroupWaitsUntilAllItsActionsAreReady) {
  // PyTorch checks a group's sub-actions before running any of them: 1F0 cannot use the
  // output of 0F0 from the same group.
  const Schedule s = from_rows({"(0F0;1F0)OVERLAP_F_B,1B0,0B0"}, {0, 0}, 1);
  const std::string message = error_of([&] { lower_schedule(s); });
  EXPECT_NE(message.find("rank 0, position 0, (0F0;1F0)OVERLAP_F_B 1F0 waits for its input: 0F0 (later on this rank)"),
            std::string::npos)
      << message;
}

TEST(Lowering, LoweringValidatesItsInputFirst) {
  const Schedule missing_backward = from_rows({"0F0,0B0,0F1", "1F0,1B0,1F1,1B1"}, {0, 1}, 2);
  EXPECT_NE(error_of([&] { lower_schedule(missing_backward); }).find("never runs a backward for microbatch 1"),
            std::string::npos);
  const Schedule lowered_already = lower_schedule(generate_schedule(ScheduleKind::gpipe, {2, std::nullopt, 2}));
  EXPECT_NE(error_of([&] { lower_schedule(lowered_already); }).find("compute_only schedule holds"), std::string::npos);
}

TEST(Lowering, RuntimePassesReshardInThePythonSetOrderPyTorchIteratesIn) {
  // Each case: adds (a) and removes (r), and the order Python 3.11 then iterates the set in.
  const std::vector<std::pair<std::string, std::vector<int>>> cases = {
      {"a0 a8 r0 a16", {16, 8}},
      {"a19 r19 a12 a15 r15 a13 a15 r15 r12 a7", {7, 13}},
      {"a14 a14 a6 r14 a5 r6 r5 a12 a5 a2 r2 a0 a10 r5 a9 a2 a8 r10 a2 a10 a9 r10 a12 r8 r0 a0 r0 a12 r12 a8 r8 r9 "
       "a3 r2 r3 a15 r15 a14 a4 r14",
       {4}},
      {"a7 r7 a0 r0 a1 r1 a38 a6 r6 r38 a0 a21 a24 r0 r21 r24 a23 a8 a30 a8 a11 a19 a39 r11 r39 r30 a38 r8 r19 a16 "
       "r38 r23 a38 a33 r38 a8 r33 a39 a17 r16",
       {17, 39, 8}},
      {"a95 r95 a52 r52 a5 r5 a67 a16 r16 a42 a88 a17 a2 a45 a4 r67 r2 a40 r4 r88 r17 a94 a16 a43 r94 a9 a53 a3 a73 "
       "r45 r3 a10 r10 a53 a49 a88 a56 a69 r69 r88",
       {40, 9, 42, 43, 73, 16, 49, 53, 56}},
      {"a89 a235 a115 a629 a497 r89 r235 a207 a771 a675 a510 a334 r510 r497 a772 a901 r629 a324 r324 a857 a41 a972 "
       "a841 r841 a947 r772 r947 a322 a862 a463 r41 r901 r463 a316 a577 r316 r334 r675 r322 a644",
       {577, 771, 644, 972, 207, 857, 862, 115}},
  };
  for (const auto& [ops, expected] : cases) {
    detail::PythonIntSet set;
    for (const std::string& op : testing::split(ops, ' ')) {
      const int key = std::stoi(op.substr(1));
      if (op[0] == 'a') {
        set.add(key);
      } else {
        ASSERT_TRUE(set.contains(key)) << op;
        set.discard(key);
      }
    }
    EXPECT_EQ(set.in_iteration_order(), expected) << ops;
  }
}

}  // namespace
}  // namespace remat::pipeline
