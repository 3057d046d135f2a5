// Generators against PyTorch 2.11's own output (tests/pipeline/reference, written by
// make_reference.py there): every reference schedule action for action and byte for byte, a
// digest of every shape of a larger grid, and exactly PyTorch's refusals with messages that
// name the parameter, its value and what is accepted.

#include <remat/pipeline/csv.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/validate.hpp>

#include "reference_files.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace remat::pipeline {
namespace {

using testing::cells_of;
using testing::csv_of;
using testing::reference_cells;

// PyTorch's pipeline_order for GPipe and 1F1B: the timeline without idle steps, each rank
// ending with REDUCE_GRAD.
std::vector<std::vector<std::string>> without_idle_steps_with_reduce_grad(
    const std::vector<std::vector<std::string>>& timeline) {
  std::vector<std::vector<std::string>> orders(timeline.size());
  for (std::size_t rank = 0; rank < timeline.size(); ++rank) {
    for (const std::string& cell : timeline[rank]) {
      if (!cell.empty()) orders[rank].push_back(cell);
    }
    orders[rank].push_back(std::to_string(rank) + "REDUCE_GRAD");
  }
  return orders;
}

// The first cell where two schedules differ, or "" when they are equal.
std::string first_difference(const std::vector<std::vector<std::string>>& ours,
                             const std::vector<std::vector<std::string>>& theirs) {
  if (ours.size() != theirs.size()) {
    return std::to_string(ours.size()) + " ranks, PyTorch has " + std::to_string(theirs.size());
  }
  for (std::size_t rank = 0; rank < ours.size(); ++rank) {
    for (std::size_t i = 0; i < std::max(ours[rank].size(), theirs[rank].size()); ++i) {
      const std::string a = i < ours[rank].size() ? ours[rank][i] : "<end>";
      const std::string b = i < theirs[rank].size() ? theirs[rank][i] : "<end>";
      if (a != b) {
        return "rank " + std::to_string(rank) + ", position " + std::to_string(i) + ": ours '" + a + "', PyTorch's '" +
               b + "'";
      }
    }
  }
  return "";
}

std::string refusal(ScheduleKind kind, ScheduleShape shape) {
  try {
    generate_schedule(kind, shape);
  } catch (const PlanError& e) {
    return e.what();
  }
  return "";
}

TEST(Generators, EveryReferenceScheduleMatchesPyTorchActionForActionAndByteForByte) {
  const auto shapes = testing::reference_shapes();
  ASSERT_GE(shapes.size(), 21u);
  for (const auto& ref : shapes) {
    const Schedule ours = generate_schedule(ref.kind, ref.shape);
    EXPECT_EQ(first_difference(cells_of(ours), reference_cells(ref.compute_only)), "") << ref.label();
    EXPECT_EQ(csv_of(ours), testing::read_bytes(testing::reference_path(ref.compute_only))) << ref.label();
  }
}

TEST(Generators, EachScheduleHasAtLeastThreeReferenceShapes) {
  for (const ScheduleKind kind : all_schedule_kinds()) {
    int count = 0;
    for (const auto& ref : testing::reference_shapes()) count += ref.kind == kind;
    EXPECT_GE(count, 3) << to_string(kind);
  }
}

TEST(Generators, GridOfShapesMatchesPyTorchDigests) {
  int compared = 0;
  for (const auto& g : testing::grid_shapes()) {
    if (g.refused) continue;
    EXPECT_EQ(testing::fnv1a64(csv_of(generate_schedule(g.kind, g.shape))), g.compute_only) << g.label();
    ++compared;
  }
  EXPECT_GT(compared, 1500);
}

TEST(Generators, RefusesExactlyTheShapesPyTorchRefuses) {
  int refused = 0;
  for (const auto& g : testing::grid_shapes()) {
    const std::string message = refusal(g.kind, g.shape);
    EXPECT_EQ(!message.empty(), g.refused) << g.label() << ": " << message;
    refused += g.refused;
  }
  EXPECT_GT(refused, 1000);
}

// PyTorch's Schedule1F1B.pipeline_order numbers the last rank's forwards 1..M; ours are 0..M-1.
// Undo exactly that on the reference, and the rest must be PyTorch's pipeline_order: our
// timeline without idle steps, one REDUCE_GRAD per rank at the end.
TEST(Generators, OneFOneBDiffersFromPyTorchsPipelineOrderOnlyInTheLastRanksForwardNumbers) {
  int checked = 0;
  for (const auto& ref : testing::reference_shapes()) {
    if (ref.kind != ScheduleKind::one_f_one_b) continue;
    auto theirs = reference_cells(ref.pipeline_order);
    auto& last = theirs.back();
    EXPECT_EQ(last.front(), std::to_string(ref.shape.ranks - 1) + "F1") << "PyTorch's bug is gone? " << ref.label();
    for (std::string& cell : last) {
      const auto f = cell.find('F');
      if (f != std::string::npos) cell = cell.substr(0, f + 1) + std::to_string(std::stoi(cell.substr(f + 1)) - 1);
    }
    const auto ours = without_idle_steps_with_reduce_grad(cells_of(generate_schedule(ref.kind, ref.shape)));
    EXPECT_EQ(first_difference(ours, theirs), "") << ref.label();
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(Generators, GPipePipelineOrderIsOurTimelineWithoutIdleStepsAndWithReduceGrad) {
  int checked = 0;
  for (const auto& ref : testing::reference_shapes()) {
    if (ref.kind != ScheduleKind::gpipe) continue;
    const auto ours = without_idle_steps_with_reduce_grad(cells_of(generate_schedule(ref.kind, ref.shape)));
    EXPECT_EQ(first_difference(ours, reference_cells(ref.pipeline_order)), "") << ref.label();
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(Generators, GPipeFillsThenDrainsWithThreeIdleStepsPerHop) {
  const Schedule s = generate_schedule(ScheduleKind::gpipe, {2, std::nullopt, 3});
  EXPECT_EQ(cells_of(s), (std::vector<std::vector<std::string>>{{"0F0", "0F1", "0F2", "", "", "", "0B0", "0B1", "0B2"},
                                                                {"", "1F0", "1F1", "1F2", "1B0", "1B1", "1B2"}}));
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.microbatches, 3);
}

TEST(Generators, EveryGeneratedScheduleIsValid) {
  for (const auto& g : testing::grid_shapes()) {
    if (g.refused) continue;
    EXPECT_NO_THROW(validate_schedule(generate_schedule(g.kind, g.shape), CsvFormat::compute_only)) << g.label();
  }
}

TEST(Generators, LoopedSchedulesPutStageSOnRankSModR) {
  const Schedule s = generate_schedule(ScheduleKind::interleaved_1f1b, {4, 3, 8});
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(generate_schedule(ScheduleKind::looped_bfs, {3, 2, 2}).stage_to_rank, (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

TEST(Generators, VShapedSchedulesPutStagesRAnd2RMinus1MinusROnRankR) {
  for (const ScheduleKind kind : {ScheduleKind::zbv_zero_bubble, ScheduleKind::dualpipev}) {
    const Schedule s = generate_schedule(kind, {4, std::nullopt, 8});
    EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0})) << to_string(kind);
  }
}

TEST(Generators, DefaultStagesPerRankAreOneForSingleStageAndTwoOtherwise) {
  EXPECT_EQ(generate_schedule(ScheduleKind::gpipe, {4, std::nullopt, 4}).num_stages(), 4);
  EXPECT_EQ(generate_schedule(ScheduleKind::one_f_one_b, {4, std::nullopt, 4}).num_stages(), 4);
  EXPECT_EQ(generate_schedule(ScheduleKind::interleaved_1f1b, {4, std::nullopt, 8}).num_stages(), 8);
  EXPECT_EQ(generate_schedule(ScheduleKind::looped_bfs, {4, std::nullopt, 8}).num_stages(), 8);
  EXPECT_EQ(generate_schedule(ScheduleKind::interleaved_zero_bubble, {4, std::nullopt, 8}).num_stages(), 8);
  EXPECT_EQ(generate_schedule(ScheduleKind::zbv_zero_bubble, {4, std::nullopt, 8}).num_stages(), 8);
  EXPECT_EQ(generate_schedule(ScheduleKind::dualpipev, {4, std::nullopt, 8}).num_stages(), 8);
}

TEST(Generators, ZbvWithFewerMicrobatchesThanTheVTurnsTheMissingOnesIntoIdleSteps) {
  const Schedule s = generate_schedule(ScheduleKind::zbv_zero_bubble, {4, std::nullopt, 1});
  for (const RankOrder& order : s.ranks) {
    int busy = 0;
    for (const auto& step : order) {
      if (!step) continue;
      EXPECT_EQ(step->microbatch, 0);
      ++busy;
    }
    EXPECT_EQ(busy, 6);  // F, I and W on each of the rank's two stages
  }
}

TEST(Generators, DualPipeVOverlapsAForwardWithABackwardInTheSteadyState) {
  const Schedule s = generate_schedule(ScheduleKind::dualpipev, {2, std::nullopt, 4});
  // As PyTorch's dualpipev_r2_v2_m4 reference: F of one stage runs together with B of the other.
  EXPECT_EQ(cells_of(s)[0], (std::vector<std::string>{"0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1",
                                                      "(0F3;3B1)OVERLAP_F_B", "(3F2;0B0)OVERLAP_F_B", "3B2",
                                                      "(3F3;0B1)OVERLAP_F_B", "3B3", "0I2", "0W2", "0I3", "0W3"}));
}

TEST(Generators, OneFOneBRefusesFewerMicrobatchesThanStages) {
  const std::string message = refusal(ScheduleKind::one_f_one_b, {4, std::nullopt, 3});
  EXPECT_NE(message.find("microbatches = 3"), std::string::npos) << message;
  EXPECT_NE(message.find("4 stages"), std::string::npos) << message;
  EXPECT_NE(message.find("microbatches >= 4"), std::string::npos) << message;
}

TEST(Generators, InterleavedRefusesMicrobatchesTheRoundsDoNotDivideAndNamesTheNearestAccepted) {
  for (const ScheduleKind kind : {ScheduleKind::interleaved_1f1b, ScheduleKind::interleaved_zero_bubble}) {
    const std::string message = refusal(kind, {4, 2, 9});
    EXPECT_NE(message.find("max(1, microbatches / ranks) = 2"), std::string::npos) << message;
    EXPECT_NE(message.find("microbatches = 9 with 4 ranks"), std::string::npos) << message;
    EXPECT_NE(message.find("8 and 10"), std::string::npos) << message;
  }
  EXPECT_NE(refusal(ScheduleKind::interleaved_1f1b, {4, 2, 18}).find("16 and 20"), std::string::npos);
  EXPECT_EQ(refusal(ScheduleKind::interleaved_1f1b, {4, 2, 7}), "");  // one round of 7
}

TEST(Generators, VShapedSchedulesRefuseAnythingButTwoStagesPerRank) {
  for (const ScheduleKind kind : {ScheduleKind::zbv_zero_bubble, ScheduleKind::dualpipev}) {
    for (const int v : {1, 3, 4}) {
      const std::string message = refusal(kind, {4, v, 16});
      EXPECT_NE(message.find("virtual_stages must be 2, got " + std::to_string(v)), std::string::npos) << message;
    }
  }
}

TEST(Generators, DualPipeVRefusesFewerMicrobatchesThanStages) {
  const std::string message = refusal(ScheduleKind::dualpipev, {4, std::nullopt, 7});
  EXPECT_NE(message.find("2 x ranks = 8"), std::string::npos) << message;
  EXPECT_NE(message.find("microbatches = 7"), std::string::npos) << message;
  EXPECT_EQ(refusal(ScheduleKind::dualpipev, {4, std::nullopt, 8}), "");
}

TEST(Generators, SingleStageSchedulesRefuseSeveralStagesPerRank) {
  const std::string message = refusal(ScheduleKind::gpipe, {4, 2, 8});
  EXPECT_NE(message.find("virtual_stages must be 1, got 2"), std::string::npos) << message;
  EXPECT_NE(refusal(ScheduleKind::one_f_one_b, {4, 0, 8}).find("got 0"), std::string::npos);
}

TEST(Generators, RefusesCountsThatAreNotPositive) {
  EXPECT_NE(refusal(ScheduleKind::gpipe, {0, std::nullopt, 4}).find("ranks must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(refusal(ScheduleKind::gpipe, {-3, std::nullopt, 4}).find("got -3"), std::string::npos);
  EXPECT_NE(refusal(ScheduleKind::looped_bfs, {4, 2, 0}).find("microbatches must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(refusal(ScheduleKind::looped_bfs, {4, 0, 4}).find("virtual_stages (stages per rank) must be at least 1"),
            std::string::npos);
  EXPECT_NE(refusal(ScheduleKind::interleaved_1f1b, {4, -1, 4}).find("got -1"), std::string::npos);
}

TEST(Generators, RefusesSchedulesTooLargeToPlanWithoutOverflowing) {
  EXPECT_NE(refusal(ScheduleKind::gpipe, {2147483647, std::nullopt, 2147483647}).find("too large"), std::string::npos);
  EXPECT_NE(refusal(ScheduleKind::interleaved_1f1b, {8, 1000000, 256}).find("too large"), std::string::npos);
  EXPECT_NE(refusal(ScheduleKind::zbv_zero_bubble, {100000, std::nullopt, 1}).find("too large"), std::string::npos);
  EXPECT_EQ(refusal(ScheduleKind::interleaved_1f1b, {8, 4, 256}), "");
}

TEST(Generators, NamesAreTheCommandLineOnesAndPyTorchsClassNamesAlsoParse) {
  const std::vector<std::string> names = {
      "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev"};
  ASSERT_EQ(all_schedule_kinds().size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(to_string(all_schedule_kinds()[i]), names[i]);
    EXPECT_EQ(parse_schedule_kind(names[i]), all_schedule_kinds()[i]);
  }
  EXPECT_EQ(parse_schedule_kind("Interleaved1F1B"), ScheduleKind::interleaved_1f1b);
  EXPECT_EQ(parse_schedule_kind("ZBVZeroBubble"), ScheduleKind::zbv_zero_bubble);
  EXPECT_EQ(parse_schedule_kind("LOOPED_BFS"), ScheduleKind::looped_bfs);
  EXPECT_EQ(parse_schedule_kind("1F1B"), ScheduleKind::one_f_one_b);
  EXPECT_FALSE(parse_schedule_kind("zero-bubble").has_value());
  EXPECT_FALSE(parse_schedule_kind("").has_value());
  EXPECT_FALSE(parse_schedule_kind("PipelineScheduleMulti").has_value());
}

}  // namespace
}  // namespace remat::pipeline
