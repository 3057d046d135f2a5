// NeMo AutoModel's closed-form ring (recv_buffer_pool._ring_size) and its schedule gate,
// with the cases NeMo's own tests publish.

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/ring.hpp>

#include <gtest/gtest.h>

#include <string>

namespace remat::pipeline {
namespace {

TEST(NemoRing, StageZeroOfEightHoldsEightInFlightPlusSlack) { EXPECT_EQ(nemo_ring_size(8, 0, 64, 2), 10); }

TEST(NemoRing, LastStageWithoutSlackGetsTheFloorOfTwo) { EXPECT_EQ(nemo_ring_size(8, 7, 64, 0), 2); }

TEST(NemoRing, TheMicrobatchCountCapsTheRing) { EXPECT_EQ(nemo_ring_size(8, 0, 4, 2), 4); }

TEST(NemoRing, FourStagesStageOneSixteenMicrobatchesSlackTwoGivesFive) { EXPECT_EQ(nemo_ring_size(4, 1, 16, 2), 5); }

TEST(NemoRing, TheFloorOfTwoHoldsEvenAboveTheMicrobatchCount) { EXPECT_EQ(nemo_ring_size(1, 0, 1, 0), 2); }

TEST(NemoRing, HugeSlackDoesNotOverflow) { EXPECT_EQ(nemo_ring_size(8, 0, 64, 2147483647), 64); }

TEST(NemoRing, NegativeSlackIsRefused) {
  try {
    nemo_ring_size(4, 0, 8, -1);
    FAIL() << "accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("slack -1 is negative"), std::string::npos) << e.what();
  }
}

TEST(NemoRing, AStageOutsideThePipelineIsRefused) {
  EXPECT_THROW(nemo_ring_size(4, 4, 8, 2), PlanError);
  EXPECT_THROW(nemo_ring_size(4, -1, 8, 2), PlanError);
  EXPECT_THROW(nemo_ring_size(0, 0, 8, 2), PlanError);
  EXPECT_THROW(nemo_ring_size(4, 0, 0, 2), PlanError);
}

TEST(NemoGate, OneFOneBInAnyLetterCaseIsSupported) {
  for (const char* name : {"1f1b", "1F1B", "1F1b", "1f1B"}) EXPECT_TRUE(schedule_supports_recv_pool(name)) << name;
}

TEST(NemoGate, EveryOtherScheduleAndUnknownNamesAreNot) {
  for (const char* name : {"gpipe", "GPipe", "interleaved-1f1b", "Interleaved1F1B", "looped-bfs", "LoopedBFS",
                           "interleaved-zero-bubble", "zbv-zero-bubble", "ZBVZeroBubble", "dualpipev", "DualPipeV", "",
                           " 1f1b", "1f1b ", "1f1b2", "one-f-one-b", "Schedule1F1B"}) {
    EXPECT_FALSE(schedule_supports_recv_pool(name)) << "'" << name << "'";
  }
}

}  // namespace
}  // namespace remat::pipeline
