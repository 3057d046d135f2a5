// Plans: the ring the runtime uses per stage and direction (NeMo's closed form where it is
// 1F1B's and safe, the colored minimum otherwise), the unsafe verdict with the safe size,
// stock against pooled bytes, GPipe's activations that the pool cannot save, spare sets, rings
// shared by a rank's stages, and the pipeline-plan dump.

#include "schedule_rows.hpp"

#include <remat/pipeline/buffers.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/plan.hpp>

#include <gtest/gtest.h>

#include <string>

namespace remat::pipeline {
namespace {

const StagePlan& entry(const PipelinePlan& plan, int stage, Direction direction) {
  for (const StagePlan& e : plan.entries)
    if (e.stage == stage && e.direction == direction) return e;
  throw PlanError("no entry");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

PipelinePlan one_f_one_b(int slack, std::optional<std::uint64_t> bytes = std::nullopt) {
  PlanOptions options;
  options.schedule_name = "1f1b";
  options.slack = slack;
  options.buffer_bytes = bytes;
  return plan_receive_buffers(testing::one_f_one_b_3x4(), options);
}

TEST(Plan, OneFOneBUsesNemosRingWhereItIsSafe) {
  const PipelinePlan plan = one_f_one_b(2);
  EXPECT_TRUE(plan.closed_form_applies);
  const StagePlan& middle = entry(plan, 1, Direction::forward);
  EXPECT_EQ(middle.min_slots, 3);
  ASSERT_TRUE(middle.closed_form.has_value());
  EXPECT_EQ(middle.closed_form->size, 4);  // max(2, min(4, 3 - 1 + 2))
  EXPECT_TRUE(middle.closed_form->safe);
  EXPECT_EQ(middle.ring_size, 4);
  EXPECT_EQ(entry(plan, 2, Direction::forward).ring_size, 3);
  EXPECT_EQ(entry(plan, 0, Direction::backward).min_slots, 1);
  EXPECT_EQ(entry(plan, 0, Direction::backward).ring_size, 4);
  EXPECT_EQ(plan.unsafe_closed_forms(), 0);
}

TEST(Plan, ANemoRingBelowTheColoredMinimumIsUnsafeAndTheRuntimeUsesTheMinimum) {
  const PipelinePlan plan = one_f_one_b(0);
  const StagePlan& middle = entry(plan, 1, Direction::forward);
  EXPECT_EQ(middle.closed_form->size, 2);  // S - s = 2, but 3 forward inputs are live at once
  EXPECT_FALSE(middle.closed_form->safe);
  EXPECT_EQ(middle.ring_size, 3);
  EXPECT_TRUE(entry(plan, 2, Direction::forward).closed_form->safe);  // the floor of 2 saves the last stage
  EXPECT_EQ(plan.unsafe_closed_forms(), 1);
  const std::string text = format_plan(plan);
  EXPECT_TRUE(contains(text, "2 UNSAFE")) << text;
  EXPECT_TRUE(contains(text, "unsafe: rank 1, stage 1 F: NeMo's ring of 2 is smaller than the 3 buffers live at once"))
      << text;
  EXPECT_TRUE(contains(text, "the safe size is 3 (slack 1 or more)")) << text;
}

TEST(Plan, StagesThatReceiveNothingHaveNoRing) {
  const PipelinePlan plan = one_f_one_b(2);
  for (const auto& [stage, direction] : {std::pair{0, Direction::forward}, std::pair{2, Direction::backward}}) {
    const StagePlan& e = entry(plan, stage, direction);
    EXPECT_FALSE(e.ring_size.has_value());
    EXPECT_FALSE(e.closed_form.has_value());
    EXPECT_EQ(e.received, 0);
    EXPECT_EQ(e.pooled_sets(), 0);
  }
}

TEST(Plan, StockIsOneSetPerMicrobatchAndPooledOnePerRingSlot) {
  const PipelinePlan plan = one_f_one_b(0, 1u << 20);
  const StagePlan& middle = entry(plan, 1, Direction::forward);
  EXPECT_EQ(middle.stock_bytes, 4u << 20);
  EXPECT_EQ(middle.pooled_bytes, 3u << 20);
  // Receiving: stage 1 F and B, stage 2 F, stage 0 B; 4 microbatches each.
  EXPECT_EQ(plan.stock_sets(), 16);
  EXPECT_EQ(plan.pooled_sets(), 3 + 2 + 2 + 3);  // rings: 1F 3, 1B 2, 2F 2, 0B 3
  EXPECT_EQ(plan.stock_bytes(), 16u << 20);
  EXPECT_TRUE(contains(format_plan(plan), "total: stock 16 sets (16.00 MiB), pooled 10 sets (10.00 MiB): 6 fewer"));
}

TEST(Plan, WithoutBufferBytesOnlySetsAreCounted) {
  const PipelinePlan plan = one_f_one_b(2);
  EXPECT_FALSE(plan.stock_bytes().has_value());
  EXPECT_FALSE(entry(plan, 1, Direction::forward).pooled_bytes.has_value());
  EXPECT_TRUE(contains(plan_to_json(plan), "\"stock_bytes\":null"));
}

TEST(Plan, ACustomScheduleGetsTheColoredMinimum) {
  PlanOptions options;  // no name: loaded from CSV
  const PipelinePlan plan = plan_receive_buffers(testing::one_f_one_b_3x4(), options);
  EXPECT_FALSE(plan.closed_form_applies);
  EXPECT_EQ(entry(plan, 1, Direction::forward).ring_size, 3);
  EXPECT_EQ(entry(plan, 0, Direction::backward).ring_size, 1);
  EXPECT_FALSE(entry(plan, 1, Direction::forward).closed_form.has_value());
  EXPECT_TRUE(contains(format_plan(plan), "custom schedule"));
}

TEST(Plan, GPipeSavesNothingAndSaysSo) {
  PlanOptions options;
  options.schedule_name = "gpipe";
  const PipelinePlan plan = plan_receive_buffers(testing::gpipe_2x3(), options);
  EXPECT_FALSE(plan.closed_form_applies);
  EXPECT_EQ(entry(plan, 1, Direction::forward).ring_size, 3);
  EXPECT_TRUE(plan.pool_saves_nothing(Direction::forward));
  // Each gradient is consumed before the next one arrives.
  EXPECT_EQ(entry(plan, 0, Direction::backward).ring_size, 1);
  EXPECT_FALSE(plan.pool_saves_nothing(Direction::backward));
  EXPECT_TRUE(contains(format_plan(plan),
                       "the pool saves nothing on activations (F): every stage that receives them holds all 3 at once "
                       "(colored minimum = microbatches); GPipe runs every forward before any backward"))
      << format_plan(plan);
  EXPECT_FALSE(contains(format_plan(plan), "on gradients"));
  EXPECT_FALSE(one_f_one_b(2).pool_saves_nothing(Direction::forward));
}

TEST(Plan, NegativeSlackIsRefused) {
  EXPECT_THROW(one_f_one_b(-1), PlanError);
  PlanOptions options;
  options.slack = -3;
  EXPECT_THROW(plan_receive_buffers(testing::gpipe_2x3(), options), PlanError);
}

TEST(Plan, EntriesGoByRankThenStageWithFBeforeB) {
  const Schedule v_shape = testing::schedule_from_rows(
      {"0F0,0SEND_F0,3RECV_F0,3F0,3B0,3SEND_B0,0RECV_B0,0B0", "1RECV_F0,1F0,2F0,2SEND_F0,2RECV_B0,2B0,1B0,1SEND_B0"},
      {0, 1, 1, 0}, 1);
  const PipelinePlan plan = plan_receive_buffers(v_shape, {});
  std::string order;
  for (const StagePlan& e : plan.entries) {
    order += std::to_string(e.rank) + ":" + std::to_string(e.stage) + std::string(to_string(e.direction)) + " ";
  }
  EXPECT_EQ(order, "0:0F 0:0B 0:3F 0:3B 1:1F 1:1B 1:2F 1:2B ");
}

TEST(Plan, TheDumpCarriesTheHeaderEntriesAndTotals) {
  const std::string json = plan_to_json(one_f_one_b(0, 1024));
  for (const char* part :
       {"\"kind\":\"pipeline-plan\"", "\"schema_version\":1", "\"schedule\":\"1f1b\"", "\"ranks\":3", "\"stages\":3",
        "\"microbatches\":4", "\"slack\":0", "\"lowering\":null", "\"buffer_bytes\":1024",
        "\"closed_form_applies\":true",
        "{\"rank\":0,\"stage\":0,\"direction\":\"F\",\"received\":0,\"ring_size\":null,\"min_slots\":0,"
        "\"slots\":[null,null,null,null],\"stock_sets\":0,\"pooled_sets\":0,\"stock_bytes\":0,\"pooled_bytes\":0}",
        "{\"rank\":1,\"stage\":1,\"direction\":\"F\",\"received\":4,\"ring_size\":3,\"min_slots\":3,"
        "\"slots\":[0,1,2,0],\"stock_sets\":4,\"pooled_sets\":3,\"stock_bytes\":4096,\"pooled_bytes\":3072,"
        "\"closed_form_ring\":2,\"closed_form_safe\":false}",
        "\"totals\":{\"stock_sets\":16,\"pooled_sets\":10,\"shared_sets\":7,\"stock_bytes\":16384,\"pooled_bytes\":10240,"
        "\"unsafe_closed_forms\":1}"}) {
    EXPECT_TRUE(contains(json, part)) << part << "\nin\n" << json;
  }
  EXPECT_EQ(json.back(), '\n');
}

TEST(Plan, SpareSetsLengthenReuseAndTheClosedFormCanBeLeftOut) {
  PlanOptions options;
  options.schedule_name = "1f1b";
  options.use_closed_form = false;
  options.spare_sets = 1;
  const PipelinePlan plan = plan_receive_buffers(testing::one_f_one_b_3x4(), options);
  EXPECT_FALSE(plan.closed_form_used);
  const StagePlan& middle = entry(plan, 1, Direction::forward);
  EXPECT_EQ(middle.min_slots, 3);
  EXPECT_EQ(middle.ring_size, 4);  // the colored minimum and one spare
  EXPECT_EQ(middle.slots, (std::vector<std::optional<int>>{0, 1, 2, 3}));  // the slot freed longest ago
  const StagePlan& first = entry(plan, 0, Direction::backward);
  EXPECT_EQ(first.ring_size, 2);
  EXPECT_EQ(first.slots, (std::vector<std::optional<int>>{0, 1, 0, 1}));
  options.spare_sets = 100;  // capped at one set per microbatch received
  EXPECT_EQ(entry(plan_receive_buffers(testing::one_f_one_b_3x4(), options), 1, Direction::forward).ring_size, 4);
  options.spare_sets = -1;
  EXPECT_THROW(plan_receive_buffers(testing::one_f_one_b_3x4(), options), PlanError);
}

TEST(Plan, ARingSmallerThanTheLiveSetIsRefusedWhenColoring) {
  const std::vector<LiveInterval> overlapping = {{0, 0, 5}, {1, 1, 6}, {2, 2, 7}};
  int count = 0;
  EXPECT_THROW(color_intervals(overlapping, count, 2), PlanError);
  EXPECT_EQ(color_intervals(overlapping, count, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(count, 3);
}

TEST(Plan, ARanksStagesShareOneRingOfTheirLiveIntervalsTogether) {
  // A V on two ranks: rank 1 holds stages 1 and 2, neighbours that exchange nothing; rank 0
  // holds stages 0 and 3, and stage 3 receives activations while stage 0 receives gradients.
  const Schedule v = testing::schedule_from_rows(
      {"0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,3F0,3B0,3SEND_B0,3RECV_F1,3F1,3B1,3SEND_B1,0RECV_B0,0B0,0RECV_B1,0B1",
       "1RECV_F0,1F0,2F0,2SEND_F0,1RECV_F1,1F1,2F1,2SEND_F1,2RECV_B0,2B0,1B0,1SEND_B0,2RECV_B1,2B1,1B1,1SEND_B1"},
      {0, 1, 1, 0}, 2);
  PlanOptions options;
  const PipelinePlan plan = plan_receive_buffers(v, options);
  ASSERT_EQ(plan.shared.size(), 4u);
  const SharedRing& rank0_forward = plan.shared[0];
  EXPECT_EQ(rank0_forward.rank, 0);
  EXPECT_EQ(rank0_forward.direction, Direction::forward);
  EXPECT_EQ(rank0_forward.stages, (std::vector<int>{3}));
  const SharedRing& rank1_forward = plan.shared[2];
  EXPECT_EQ(rank1_forward.stages, (std::vector<int>{1}));  // stage 2 takes stage 1's output on the rank
  EXPECT_EQ(rank1_forward.min_slots, 2);
  EXPECT_EQ(rank0_forward.min_slots, 1);  // 3RECV_F1 comes after 3B0
  EXPECT_EQ(plan.shared_sets(), 1 + 1 + 2 + 1);
  EXPECT_FALSE(contains(format_plan(plan), "shared ring:"));  // no rank has two receiving stages per direction
}

TEST(Plan, InterleavedStagesOnARankShareFewerSetsThanSeparateRings) {
  const Schedule interleaved = 
      lower_schedule_for_runtime(generate_schedule(ScheduleKind::interleaved_1f1b, {4, 2, 16}));
  const PipelinePlan plan = plan_receive_buffers(interleaved, PlanOptions{});
  int separate = 0;
  for (const SharedRing& ring : plan.shared) {
    EXPECT_LE(ring.min_slots, ring.separate_slots);
    separate += ring.separate_slots;
    for (std::size_t i = 0; i < ring.stages.size(); ++i) {
      // Microbatches live at once on any of the rank's stages never share a slot: the coloring
      // is valid for the union, so every slot index is below the ring size.
      for (const std::optional<int>& slot : ring.slots[i]) {
        if (slot) {
          EXPECT_LT(*slot, ring.min_slots);
        }
      }
    }
  }
  EXPECT_EQ(separate, plan.pooled_sets());
  EXPECT_LT(plan.shared_sets(), plan.pooled_sets());
  EXPECT_TRUE(contains(format_plan(plan), "shared ring: rank 1 F (stages 1, 5): 10 sets for all, against 12 in separate rings"));
  EXPECT_TRUE(contains(plan_to_json(plan), "{\"rank\":1,\"direction\":\"F\",\"stages\":[1,5],\"min_slots\":10,\"separate_slots\":12"));
}

TEST(ReceiveBuffers, ASendOfTheReceivedBufferKeepsItLive) {
  // Stage 1 sends its input gradient back after its backward (it can be the buffer itself).
  const Schedule s = testing::schedule_from_rows(
      {"0F0,0SEND_F0,0RECV_B0,0B0", "1RECV_F0,1F0,1SEND_F0,1RECV_B0,1B0,1SEND_B0", "2RECV_F0,2F0,2B0,2SEND_B0"},
      {0, 1, 2}, 1);
  const BufferAnalysis analysis = analyze_receive_buffers(s);
  EXPECT_EQ(analysis.at(1, Direction::backward).intervals[0].end, 5);  // 1SEND_B0, not 1B0 at 4
  EXPECT_EQ(analysis.at(1, Direction::forward).intervals[0].end, 4);   // 1B0 after 1SEND_F0
}

}  // namespace
}  // namespace remat::pipeline
