// validate_schedule, one test per rule, each error naming the rank, the position and the
// action; and the schedules PyTorch generates and lowers pass.

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/validate.hpp>

#include "reference_files.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace remat::pipeline {
namespace {

Schedule rows(const std::vector<std::string>& text, std::vector<int> stage_to_rank, int microbatches) {
  Schedule s;
  for (const std::string& row : text) {
    RankOrder order;
    if (!row.empty()) {
      for (const std::string& cell : testing::split(row, ',')) order.push_back(parse_action(cell));
    }
    s.ranks.push_back(std::move(order));
  }
  s.stage_to_rank = std::move(stage_to_rank);
  s.microbatches = microbatches;
  return s;
}

std::string error_of(const Schedule& s, CsvFormat format) {
  try {
    validate_schedule(s, format);
  } catch (const PlanError& e) {
    return e.what();
  }
  return "";
}

constexpr CsvFormat only = CsvFormat::compute_only;
constexpr CsvFormat comms = CsvFormat::compute_comms;

#define EXPECT_MESSAGE(message, text) EXPECT_NE((message).find(text), std::string::npos) << (message)

TEST(Validate, AValidScheduleOfEachFormPasses) {
  EXPECT_EQ(error_of(rows({"0F0,0F1,,0B0,0B1", "1F0,1B0,1F1,1B1"}, {0, 1}, 2), only), "");
  EXPECT_EQ(error_of(rows({"0F0,0SEND_F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"}, {0, 1}, 1), comms), "");
  EXPECT_EQ(error_of(rows({"0F0,0I0,0W0"}, {0}, 1), only), "");
}

TEST(Validate, BackwardBeforeItsForwardIsRefused) {
  const std::string m = error_of(rows({"0F0,0B1,0F1,0B0"}, {0}, 2), only);
  EXPECT_MESSAGE(m, "rank 0, position 1, 0B1: a backward runs after its forward, but 0F1 comes later, at position 2");
}

TEST(Validate, InputBackwardBeforeItsForwardIsRefused) {
  const std::string m = error_of(rows({"0I0,0F0,0W0"}, {0}, 1), only);
  EXPECT_MESSAGE(m, "rank 0, position 0, 0I0: a backward runs after its forward");
}

TEST(Validate, WeightBackwardBeforeItsInputBackwardIsRefused) {
  const std::string m = error_of(rows({"0F0,0W0,0I0"}, {0}, 1), only);
  EXPECT_MESSAGE(m, "rank 0, position 1, 0W0: a W runs after the I of its stage and microbatch, but 0I0 comes later");
}

TEST(Validate, WeightBackwardWithoutInputBackwardIsRefused) {
  const std::string m = error_of(rows({"0F0,0B0,0W0"}, {0}, 1), only);
  EXPECT_MESSAGE(
      m, "rank 0, position 2, 0W0: a W runs after the I of its stage and microbatch, but the schedule has no 0I0");
}

TEST(Validate, InputBackwardWithoutWeightBackwardIsRefused) {
  const std::string m = error_of(rows({"0F0,0I0"}, {0}, 1), only);
  EXPECT_MESSAGE(m, "rank 0, position 1, 0I0: no 0W0 follows it");
}

TEST(Validate, BothFullAndSplitBackwardForOneMicrobatchIsRefused) {
  const std::string m = error_of(rows({"0F0,0B0,0I0,0W0"}, {0}, 1), only);
  EXPECT_MESSAGE(m, "rank 0, position 1, 0B0: stage 0 also runs 0I0 (position 2)");
}

TEST(Validate, AnActionRunTwiceIsRefusedNamingBothPlaces) {
  const std::string m = error_of(rows({"0F0,0F1,0F0,0B0,0B1"}, {0}, 2), only);
  EXPECT_MESSAGE(m, "rank 0, position 2, 0F0: runs a second time (first at position 0)");
}

TEST(Validate, AMissingForwardIsRefusedNamingStageAndMicrobatch) {
  const std::string m = error_of(rows({"0F0,0F1,0B0,0B1", "1F0,1B0,1B1"}, {0, 1}, 2), only);
  EXPECT_MESSAGE(m, "rank 1: stage 1 never runs 1F1");
}

TEST(Validate, AMissingBackwardIsRefusedNamingStageAndMicrobatch) {
  const std::string m = error_of(rows({"0F0,0F1,0B0"}, {0}, 2), only);
  EXPECT_MESSAGE(m, "rank 0: stage 0 never runs a backward for microbatch 1: it needs 0B1, or 0I1 and 0W1");
}

TEST(Validate, AStageOnTheWrongRankIsRefused) {
  const std::string m = error_of(rows({"0F0,1F0,1B0,0B0", ""}, {0, 1}, 1), only);
  EXPECT_MESSAGE(m, "rank 0, position 1, 1F0: stage 1 runs on rank 1, not on rank 0");
}

TEST(Validate, AStageOrMicrobatchOutOfRangeIsRefused) {
  EXPECT_MESSAGE(error_of(rows({"0F0,2F0,0B0"}, {0}, 1), only),
                 "rank 0, position 1, 2F0: stage 2 does not exist: the schedule has stages 0..0");
  EXPECT_MESSAGE(error_of(rows({"0F0,0F3,0B0"}, {0}, 1), only),
                 "rank 0, position 1, 0F3: microbatch 3 does not exist: the schedule has microbatches 0..0");
}

TEST(Validate, AnActionWithoutItsMicrobatchOrAStageWideOneWithOneIsRefused) {
  EXPECT_MESSAGE(error_of(rows({"0F,0B0"}, {0}, 1), only), "rank 0, position 0, 0F: no microbatch index");
  EXPECT_MESSAGE(error_of(rows({"0F0,0SEND_F0,0B0", "1RECV_F0,1F0,1B0,1SEND_B"}, {0, 1}, 1), comms),
                 "rank 1, position 3, 1SEND_B: no microbatch index");
  EXPECT_MESSAGE(error_of(rows({"0UNSHARD2,0F0,0B0"}, {0}, 1), comms),
                 "rank 0, position 0, 0UNSHARD2: UNSHARD takes no microbatch");
}

TEST(Validate, ARankWithoutStagesIsRefused) {
  EXPECT_MESSAGE(error_of(rows({"0F0,0B0", ""}, {0}, 1), only), "rank 1 runs no stage");
}

TEST(Validate, CommunicationInAComputeOnlyScheduleIsRefused) {
  const std::string m = error_of(rows({"0F0,0SEND_F0,0B0", "1RECV_F0,1F0,1B0"}, {0, 1}, 1), only);
  EXPECT_MESSAGE(m, "rank 0, position 1, 0SEND_F0: a compute_only schedule holds F, B, I, W and OVERLAP_F_B only");
  EXPECT_MESSAGE(error_of(rows({"0F0,0B0,0REDUCE_GRAD"}, {0}, 1), only), "0REDUCE_GRAD: a compute_only schedule");
}

TEST(Validate, AnIdleStepInAComputeCommsScheduleIsRefused) {
  const std::string m = error_of(rows({"0F0,,0B0"}, {0}, 1), comms);
  EXPECT_MESSAGE(m, "rank 0, position 1: an empty cell (idle step) has no place in a compute_comms schedule");
}

TEST(Validate, OverlappedGroupsHoldComputeActionsOnly) {
  Schedule s = rows({"0F0,0B0"}, {0}, 1);
  Action group;
  group.stage = -1;
  group.type = ActionType::overlap_f_b;
  s.ranks[0].push_back(group);
  EXPECT_MESSAGE(error_of(s, only), "rank 0, position 2, -1OVERLAP_F_B: an OVERLAP_F_B group needs sub-actions");
  EXPECT_MESSAGE(error_of(rows({"(0F0;0SEND_F0)OVERLAP_F_B,0B0", "1RECV_F0,1F0,1B0"}, {0, 1}, 1), only),
                 "rank 0, position 0, 0SEND_F0 (in (0F0;0SEND_F0)OVERLAP_F_B): an OVERLAP_F_B group holds only F, B, I "
                 "and W");
}

TEST(Validate, ErrorsInsideAnOverlappedGroupNameTheGroup) {
  const std::string m = error_of(rows({"0F0,0B0,(0F1;0B0)OVERLAP_F_B,0B1"}, {0}, 2), only);
  EXPECT_MESSAGE(m, "rank 0, position 2, 0B0 (in (0F1;0B0)OVERLAP_F_B): runs a second time (first at position 1)");
}

TEST(Validate, AComputeOnlyScheduleThatWouldDeadlockIsRefused) {
  const std::string m = error_of(rows({"0F0,0B0,0F1,0B1", "1F0,1F1,1B0,1B1"}, {0, 1}, 2), only);
  EXPECT_MESSAGE(m, "rank 0, position 1, 0B0 waits for its gradient");
  EXPECT_MESSAGE(m, "rank 1, position 1, 1F1 waits for its input: 0F1 on rank 0");
}

TEST(Validate, AForwardWithoutTheReceiveOfItsInputIsRefused) {
  const std::string m = error_of(rows({"0F0,0SEND_F0,0RECV_B0,0B0", "1F0,1B0,1SEND_B0"}, {0, 1}, 1), comms);
  EXPECT_MESSAGE(m, "rank 0, position 1, 0SEND_F0: it must be received, but rank 1 has no 1RECV_F0");
}

TEST(Validate, AReceiveAfterTheComputeThatNeedsItIsRefused) {
  const std::string m = error_of(rows({"0F0,0SEND_F0,0RECV_B0,0B0", "1F0,1RECV_F0,1B0,1SEND_B0"}, {0, 1}, 1), comms);
  EXPECT_MESSAGE(
      m, "rank 1, position 0, 1F0: a forward runs after the receive of its input, but 1RECV_F0 is at position 1");
}

TEST(Validate, ASendBeforeItsComputeIsRefused) {
  const std::string m = error_of(rows({"0SEND_F0,0F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"}, {0, 1}, 1), comms);
  EXPECT_MESSAGE(
      m, "rank 0, position 0, 0SEND_F0: a SEND_F runs after the forward that computes it, but 0F0 is at position 1");
}

TEST(Validate, AForwardWhoseOutputIsNeverSentIsRefused) {
  const std::string m = error_of(rows({"0F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"}, {0, 1}, 1), comms);
  EXPECT_MESSAGE(
      m, "rank 0, position 0, 0F0: a forward's output goes to the next stage's rank, but rank 0 has no 0SEND_F0");
}

TEST(Validate, ABackwardWithoutTheReceiveOfItsGradientIsRefused) {
  const std::string m = error_of(rows({"0F0,0SEND_F0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"}, {0, 1}, 1), comms);
  EXPECT_MESSAGE(
      m, "rank 0, position 2, 0B0: a backward runs after the receive of its gradient, but rank 0 has no 0RECV_B0");
}

TEST(Validate, CommunicationBetweenStagesOnTheSameRankIsRefused) {
  const std::string m = error_of(rows({"0F0,0SEND_F0,1RECV_F0,1F0,1B0,0B0"}, {0, 0}, 1), comms);
  EXPECT_MESSAGE(m, "rank 0, position 1, 0SEND_F0: stages 0 and 1 both run on rank 0");
}

TEST(Validate, CommunicationPastEitherEndOfThePipelineIsRefused) {
  EXPECT_MESSAGE(error_of(rows({"0F0,0SEND_F0,0B0"}, {0}, 1), comms),
                 "rank 0, position 1, 0SEND_F0: the last stage has no next stage to send activations to");
  EXPECT_MESSAGE(error_of(rows({"0RECV_F0,0F0,0B0"}, {0}, 1), comms),
                 "rank 0, position 0, 0RECV_F0: stage 0 has no previous stage to receive activations from");
  EXPECT_MESSAGE(error_of(rows({"0F0,0B0,0SEND_B0"}, {0}, 1), comms),
                 "rank 0, position 2, 0SEND_B0: stage 0 has no previous stage to send gradients to");
}

TEST(Validate, AReceiveNobodySendsIsRefused) {
  const std::string m =
      error_of(rows({"0F0,0SEND_F0,0RECV_B0,0B0,0RECV_B1", "1RECV_F0,1F0,1B0,1SEND_B0"}, {0, 1}, 1), comms);
  EXPECT_MESSAGE(m, "0RECV_B1: microbatch 1 does not exist");
  const std::string n = error_of(
      rows({"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1", "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1"},
           {0, 1}, 2),
      comms);
  EXPECT_MESSAGE(n, "rank 0, position 6, 0RECV_B1: something must send it, but rank 1 has no 1SEND_B1");
}

TEST(Validate, ReceivesPostedInAnotherOrderThanThePeerSendsAreRefused) {
  const std::string m = error_of(rows({"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1",
                                       "1RECV_F1,1RECV_F0,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1"},
                                      {0, 1}, 2),
                                 comms);
  EXPECT_MESSAGE(m,
                 "rank 1, position 0, 1RECV_F1: it is receive number 1 from rank 0, whose send number 1 to rank 1 is "
                 "0SEND_F0 (position 1)");
  EXPECT_MESSAGE(m, "would receive the wrong tensor");
}

TEST(Validate, AComputeCommsScheduleThatDeadlocksIsRefusedNamingEachStuckRank) {
  // Every message is in place, but rank 0 sends 0F1 only after a backward that needs rank 1's
  // gradient, which rank 1 computes only after 1F1.
  const std::string m = error_of(rows({"0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1",
                                       "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1"},
                                      {0, 1}, 2),
                                 comms);
  EXPECT_MESSAGE(m, "the schedule deadlocks");
  EXPECT_MESSAGE(m, "rank 0, position 3, 0B0 waits for 1SEND_B0 on rank 1");
  EXPECT_MESSAGE(m, "rank 1, position 3, 1F1 waits for 0SEND_F1 on rank 0");
}

TEST(Validate, ReceivesMayBePostedEarlyBecauseOnlyTheComputeWaits) {
  // Both receives first: PyTorch's runtime posts them without waiting.
  EXPECT_EQ(error_of(rows({"0RECV_B0,0F0,0SEND_F0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"}, {0, 1}, 1), comms), "");
}

TEST(Validate, RuntimeActionsAreAcceptedInAComputeCommsSchedule) {
  EXPECT_EQ(error_of(rows({"0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0RESHARD",
                           "1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1RESHARD"},
                          {0, 1}, 1),
                     comms),
            "");
}

TEST(Validate, BadShapesAreRefused) {
  EXPECT_MESSAGE(error_of(Schedule{}, only), "the schedule has no ranks");
  EXPECT_MESSAGE(error_of(rows({"0F0,0B0"}, {}, 1), only), "the schedule has no stages");
  EXPECT_MESSAGE(error_of(rows({"0F0,0B0"}, {0}, 0), only), "no microbatches (microbatches = 0)");
  EXPECT_MESSAGE(error_of(rows({"0F0,0B0"}, {3}, 1), only),
                 "stage 0 is mapped to rank 3, but the schedule has ranks 0..0");
}

TEST(Validate, AHugeClaimedMicrobatchCountFailsFastOnTheMissingForward) {
  const std::string m = error_of(rows({"0F0,0B0"}, {0}, 2000000000), only);
  EXPECT_MESSAGE(m, "rank 0: stage 0 never runs 0F1");
}

}  // namespace
}  // namespace remat::pipeline
