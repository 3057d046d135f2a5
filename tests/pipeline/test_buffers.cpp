// Receive-buffer lifetimes come from the lowered order alone: forward inputs live through
// the last of B/I/W and SEND_F (inside OVERLAP_F_B too), gradients through the last of B/I/W
// and SEND_B; stages fed by a
// neighbour on the same rank receive nothing; first fit in start order uses the fewest slots.

#include "schedule_rows.hpp"

#include <remat/pipeline/buffers.hpp>
#include <remat/pipeline/errors.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace remat::pipeline {
namespace {

using testing::schedule_from_rows;

std::vector<std::optional<int>> slots(std::initializer_list<int> values) {
  std::vector<std::optional<int>> out;
  for (const int v : values) out.emplace_back(v);
  return out;
}

std::vector<std::optional<int>> none(int microbatches) {
  return std::vector<std::optional<int>>(static_cast<std::size_t>(microbatches));
}

void expect_refused(const Schedule& schedule, const std::vector<std::string>& fragments) {
  try {
    analyze_receive_buffers(schedule);
    FAIL() << "accepted";
  } catch (const PlanError& e) {
    for (const std::string& fragment : fragments) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what() << " lacks " << fragment;
    }
  }
}

TEST(ReceiveBuffers, OneFOneBForwardInputsLiveUntilTheirBackward) {
  const BufferAnalysis analysis = analyze_receive_buffers(testing::one_f_one_b_3x4());
  ASSERT_EQ(analysis.stages.size(), 6u);
  const StageBuffers& middle = analysis.at(1, Direction::forward);
  EXPECT_EQ(middle.rank, 1);
  ASSERT_EQ(middle.intervals.size(), 4u);
  EXPECT_EQ(middle.intervals[0].start, 0);  // 1RECV_F0
  EXPECT_EQ(middle.intervals[0].end, 8);    // 1B0
  EXPECT_EQ(middle.intervals[3].start, 13);
  EXPECT_EQ(middle.intervals[3].end, 22);
  // 1F1B's lowered forward depth on stage s >= 1 is S - s + 1: here 3, one more than NeMo's S - s.
  EXPECT_EQ(middle.min_slots, 3);
  EXPECT_EQ(middle.slots, slots({0, 1, 2, 0}));
  EXPECT_EQ(analysis.at(2, Direction::forward).min_slots, 2);
  EXPECT_EQ(analysis.at(2, Direction::forward).slots, slots({0, 1, 0, 1}));
  EXPECT_EQ(analysis.at(0, Direction::backward).min_slots, 1);
  EXPECT_EQ(analysis.at(1, Direction::backward).min_slots, 1);
  EXPECT_EQ(analysis.at(1, Direction::backward).slots, slots({0, 0, 0, 0}));
}

TEST(ReceiveBuffers, FirstStageReceivesNoActivationsAndLastStageNoGradients) {
  const BufferAnalysis analysis = analyze_receive_buffers(testing::one_f_one_b_3x4());
  for (const auto& [stage, direction] : {std::pair{0, Direction::forward}, std::pair{2, Direction::backward}}) {
    const StageBuffers& buffers = analysis.at(stage, direction);
    EXPECT_EQ(buffers.received(), 0);
    EXPECT_EQ(buffers.min_slots, 0);
    EXPECT_EQ(buffers.slots, none(4));
    EXPECT_EQ(buffers.stock_bytes(1000), 0u);
  }
}

TEST(ReceiveBuffers, GPipeHoldsEveryMicrobatchAtOnce) {
  const BufferAnalysis analysis = analyze_receive_buffers(testing::gpipe_2x3());
  EXPECT_EQ(analysis.at(1, Direction::forward).min_slots, 3);
  EXPECT_EQ(analysis.at(1, Direction::forward).slots, slots({0, 1, 2}));
  EXPECT_EQ(analysis.at(0, Direction::backward).min_slots, 1);
}

TEST(ReceiveBuffers, StockIsOneSetPerMicrobatchAndPooledOnePerSlot) {
  const StageBuffers middle = analyze_receive_buffers(testing::one_f_one_b_3x4()).at(1, Direction::forward);
  EXPECT_EQ(middle.stock_bytes(1000), 4000u);
  EXPECT_EQ(middle.pooled_bytes(1000), 3000u);
}

TEST(ReceiveBuffers, WeightGradientKeepsTheStageInputLive) {
  const Schedule zero_bubble = schedule_from_rows({"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0RECV_B1,0I1,0W0,0W1",
                                                   "1RECV_F0,1F0,1I0,1SEND_B0,1RECV_F1,1F1,1I1,1SEND_B1,1W0,1W1"},
                                                  {0, 1}, 2);
  const BufferAnalysis analysis = analyze_receive_buffers(zero_bubble);
  const StageBuffers& input = analysis.at(1, Direction::forward);
  EXPECT_EQ(input.intervals[0].end, 8);  // 1W0, not 1I0 at 2
  EXPECT_EQ(input.min_slots, 2);
  const StageBuffers& gradient = analysis.at(0, Direction::backward);
  EXPECT_EQ(gradient.intervals[0].end, 8);  // 0W0: stage 0 runs its whole backward at W, from the gradient
  EXPECT_EQ(gradient.min_slots, 2);
}

TEST(ReceiveBuffers, ComputeInsideOverlapContainersReadsBuffers) {
  const Schedule overlapped = schedule_from_rows({"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1",
                                                  "1RECV_F0,1F0,1RECV_F1,(1F1;1B0)OVERLAP_F_B,1SEND_B0,1B1,1SEND_B1"},
                                                 {0, 1}, 2);
  const StageBuffers input = analyze_receive_buffers(overlapped).at(1, Direction::forward);
  EXPECT_EQ(input.intervals[0].end, 3);  // the container that runs 1B0
  EXPECT_EQ(input.min_slots, 2);
}

TEST(ReceiveBuffers, NeighboursOnTheSameRankExchangeNoBuffers) {
  // A V: stages 0 and 3 on rank 0, stages 1 and 2 on rank 1.
  const Schedule v_shape = schedule_from_rows(
      {"0F0,0SEND_F0,3RECV_F0,3F0,3B0,3SEND_B0,0RECV_B0,0B0", "1RECV_F0,1F0,2F0,2SEND_F0,2RECV_B0,2B0,1B0,1SEND_B0"},
      {0, 1, 1, 0}, 1);
  const BufferAnalysis analysis = analyze_receive_buffers(v_shape);
  EXPECT_EQ(analysis.at(1, Direction::forward).received(), 1);
  EXPECT_EQ(analysis.at(2, Direction::forward).received(), 0);
  EXPECT_EQ(analysis.at(1, Direction::backward).received(), 0);
  EXPECT_EQ(analysis.at(2, Direction::backward).received(), 1);
  EXPECT_EQ(analysis.at(3, Direction::forward).rank, 0);
  EXPECT_EQ(analysis.at(3, Direction::forward).received(), 1);
  EXPECT_EQ(analysis.at(3, Direction::backward).received(), 0);
}

TEST(ReceiveBuffers, IdleStepsCountAsPositions) {
  const Schedule idle = schedule_from_rows({"0F0,0SEND_F0,,0RECV_B0,0B0", ",1RECV_F0,1F0,1B0,1SEND_B0"}, {0, 1}, 1);
  const BufferAnalysis analysis = analyze_receive_buffers(idle);
  EXPECT_EQ(analysis.at(1, Direction::forward).intervals[0].start, 1);
  EXPECT_EQ(analysis.at(0, Direction::backward).intervals[0].start, 3);
}

TEST(ReceiveBuffers, ARecvAfterTheLastReaderReusesItsSlotAndOneBeforeItDoesNot) {
  int count = 0;
  EXPECT_EQ(color_intervals({{0, 0, 2}, {1, 3, 5}}, count), (std::vector<int>{0, 0}));
  EXPECT_EQ(count, 1);
  EXPECT_EQ(color_intervals({{0, 0, 3}, {1, 2, 5}}, count), (std::vector<int>{0, 1}));
  EXPECT_EQ(count, 2);
  // Ends are inclusive: a holder whose reader sits at the start position still holds.
  EXPECT_EQ(color_intervals({{0, 0, 3}, {1, 3, 5}}, count), (std::vector<int>{0, 1}));
  EXPECT_EQ(count, 2);
  EXPECT_TRUE(color_intervals({}, count).empty());
  EXPECT_EQ(count, 0);
}

TEST(ReceiveBuffers, FirstFitUsesAsManySlotsAsBuffersLiveAtOnce) {
  std::mt19937 random(13);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<LiveInterval> intervals;
    const int n = 1 + static_cast<int>(random() % 40);
    for (int i = 0; i < n; ++i) {
      const int start = static_cast<int>(random() % 100);
      intervals.push_back({i, start, start + static_cast<int>(random() % 30)});
    }
    int count = 0;
    const std::vector<int> slots = color_intervals(intervals, count);
    int most_live = 0;
    for (int position = 0; position < 130; ++position) {
      int live = 0;
      for (const LiveInterval& interval : intervals) live += interval.start <= position && position <= interval.end;
      most_live = std::max(most_live, live);
    }
    ASSERT_EQ(count, most_live) << "trial " << trial;
    for (int a = 0; a < n; ++a) {
      for (int b = a + 1; b < n; ++b) {
        const bool overlap =
            intervals[static_cast<std::size_t>(a)].start <= intervals[static_cast<std::size_t>(b)].end &&
            intervals[static_cast<std::size_t>(b)].start <= intervals[static_cast<std::size_t>(a)].end;
        if (overlap) {
          ASSERT_NE(slots[static_cast<std::size_t>(a)], slots[static_cast<std::size_t>(b)]) << trial;
        }
      }
    }
  }
}

TEST(ReceiveBuffers, ARecvOnAnotherStagesRankIsRefused) {
  expect_refused(schedule_from_rows({"0F0,1RECV_F0", "1F0"}, {0, 1}, 1),
                 {"rank 0, position 1, action 1RECV_F0", "stage 1 runs on rank 1"});
}

TEST(ReceiveBuffers, ARecvNobodyReadsIsRefused) {
  expect_refused(schedule_from_rows({"0F0,0SEND_F0", "1RECV_F0"}, {0, 1}, 1),
                 {"rank 1, position 0, action 1RECV_F0", "nothing on rank 1 reads it"});
}

TEST(ReceiveBuffers, AComputeBeforeItsRecvIsRefused) {
  expect_refused(schedule_from_rows({"0F0,0SEND_F0", "1F0,1RECV_F0,1B0"}, {0, 1}, 1),
                 {"rank 1, position 1, action 1RECV_F0", "at position 0, before the RECV"});
}

TEST(ReceiveBuffers, ASecondRecvOfTheSameMicrobatchIsRefused) {
  expect_refused(schedule_from_rows({"0F0,0SEND_F0", "1RECV_F0,1RECV_F0,1F0,1B0"}, {0, 1}, 1),
                 {"rank 1, position 1, action 1RECV_F0", "a second time (first at position 0)"});
}

TEST(ReceiveBuffers, AMicrobatchBeyondTheCountIsRefused) {
  expect_refused(schedule_from_rows({"0F0,0SEND_F0", "1RECV_F3,1F3"}, {0, 1}, 2),
                 {"rank 1, position 0, action 1RECV_F3", "microbatch must be 0 to 1"});
}

TEST(ReceiveBuffers, AStageBeyondTheMappingIsRefused) {
  expect_refused(schedule_from_rows({"0F0", "5RECV_F0"}, {0, 1}, 1), {"stage 5 does not exist"});
}

}  // namespace
}  // namespace remat::pipeline
