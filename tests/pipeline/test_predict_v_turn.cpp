// predict_peaks on the rank holding a V's turn: 4 stages on 2 ranks (rank 0: stages 0 and 3,
// rank 1: stages 1 and 2), 2 microbatches, under PyTorch's action runtime. Stages 1 and 2 hand
// their tensors to each other instead of sending them, and what those tensors cost depends on
// the buffers: stock keeps them in the receiving stage's records until the next step, pooled
// drops them after their last reader. Each stage's figures are a different power of ten, so
// that every expected sum below reads back to the rules in predict.cpp's opening comment.

#include <remat/pipeline/action.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/predict.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace remat::pipeline {
namespace {

// Stage 1 sends to and from rank 0 in 100s and hands on 1000s; stage 2 hands back 1000s and
// sends 10000s on. Parameters and optimizer state are 10 and 1 per stage.
std::map<std::string, std::uint64_t> figures(std::uint64_t input, std::uint64_t output, std::uint64_t input_grad,
                                             std::uint64_t backward_transient, std::uint64_t grads = 0) {
  return {{"params", 10},
          {"grads", grads},
          {"optimizer_state", 1},
          {"optimizer_transient", 0},
          {"input_bytes", input},
          {"target_bytes", 0},
          {"output_bytes", output},
          {"input_grad_bytes", input_grad},
          {"loss_bytes", 0},
          {"forward_kept", output},
          {"forward_transient", 0},
          {"backward_transient", backward_transient},
          {"input_backward_kept", output},
          {"input_backward_transient", 0},
          {"weight_backward_transient", backward_transient}};
}

// Stage 1's backward (B, or W) is the heavy action, so that the peak falls there.
constexpr std::uint64_t kHeavy = 1'000'000;

// stage1_grads: what stage 1's first backward creates; where it is 0, two backwards of stage 1
// on the same level tie and the first is the peak.
std::vector<StageProfile> profiles(const std::string& runtime, std::uint64_t stage1_grads) {
  std::vector<StageProfile> all = {
      stage_profile_of("v", 0, 4, "cpu", figures(1, 100, 0, 0)),
      stage_profile_of("v", 1, 4, "cpu", figures(100, 1000, 100, kHeavy, stage1_grads)),
      stage_profile_of("v", 2, 4, "cpu", figures(1000, 10000, 1000, 0)),
      stage_profile_of("v", 3, 4, "cpu", figures(10000, 1, 10000, 0)),
  };
  for (StageProfile& profile : all) profile.runtime = runtime;
  return all;
}

RankOrder order_of(const std::vector<std::string>& actions) {
  RankOrder order;
  for (const std::string& text : actions) order.push_back(parse_action(text));
  return order;
}

// Each rank's compute order, lowered with its SEND/RECV as PyTorch's runtime does.
// split: zero-bubble style, I then W on every stage (PyTorch runs stage 0's whole backward at W);
// otherwise a full B everywhere.
Schedule v_schedule(bool split) {
  Schedule compute;
  compute.stage_to_rank = {0, 1, 1, 0};
  compute.microbatches = 2;
  if (split) {
    compute.ranks = {order_of({"0F0", "0F1", "3F0", "3F1", "3I0", "3I1", "3W0", "3W1", "0I0", "0I1", "0W0", "0W1"}),
                     order_of({"1F0", "1F1", "2F0", "2F1", "2I0", "2I1", "1I0", "1I1", "2W0", "2W1", "1W0", "1W1"})};
  } else {
    compute.ranks = {order_of({"0F0", "0F1", "3F0", "3F1", "3B0", "3B1", "0B0", "0B1"}),
                     order_of({"1F0", "1F1", "2F0", "2F1", "2B0", "2B1", "1B0", "1B1"})};
  }
  return lower_schedule(compute);
}

PredictOptions options_for(bool split, ReceiveBuffers buffers) {
  PredictOptions options;
  options.schedule_name = split ? "zbv-zero-bubble" : "dualpipev";
  options.lowering = "runtime";
  options.buffers = buffers;
  return options;
}

RankPrediction turn_rank(bool split, ReceiveBuffers buffers, const std::string& runtime = std::string(kTorchRuntime),
                         std::uint64_t stage1_grads = 0) {
  return predict_peaks(v_schedule(split), profiles(runtime, stage1_grads), options_for(split, buffers)).per_rank.at(1);
}

TEST(PredictVTurn, StockKeepsEveryMicrobatchsHandoffInBothDirectionsAsReceiveSets) {
  const RankPrediction rank = turn_rank(/*split=*/true, ReceiveBuffers::stock);
  // The step begins with the previous step's handoffs in the records: stage 1's outputs
  // (2 x 1000) and stage 2's input gradients (2 x 1000). 1F0 and 1F1 replace the outputs with
  // this step's, counted in stage 1's activations until its W; 2I0 and 2I1 replace the
  // gradients in place. At 1W0: the stock receive sets, stage 1's input (2 x 100) and stage 2's
  // output gradient (2 x 10000), and the 2 x 1000 gradients handed back.
  EXPECT_EQ(rank.action, "1W0");
  EXPECT_EQ(rank.parts.receive_buffers, 2u * 100 + 2 * 10000 + 2 * 1000);
  EXPECT_EQ(rank.parts.activations, 2u * 1000);
  // Held by sends: stage 1's input gradients (2 x 100) and stage 2's outputs (2 x 10000).
  EXPECT_EQ(rank.parts.held_for_sends, 2u * 100 + 2 * 10000);
  EXPECT_EQ(rank.peak, 20u + 2 + 2000 + 22200 + 20200 + kHeavy);
}

TEST(PredictVTurn, PooledHoldsAHandedBackGradientUntilBothItsReadersWeightPassesAreDone) {
  const RankPrediction rank = turn_rank(/*split=*/true, ReceiveBuffers::pooled);
  // At 1W0, pooled: stage 2's input gradients of both microbatches (2 x 1000) are still held,
  // by stage 1 (its W has not run) and by stage 2's input leaf (.grad) after its I; stage 1's
  // input gradients (2 x 100) and stage 2's outputs (2 x 10000) by their sends.
  EXPECT_EQ(rank.action, "1W0");
  EXPECT_EQ(rank.parts.held_for_sends, 2u * 1000 + 2 * 100 + 2 * 10000);
  EXPECT_EQ(rank.parts.activations, 2u * 1000);
}

TEST(PredictVTurn, AReceivedInputKeepsItsGradientFromIUntilTheNextStep) {
  std::vector<StageProfile> heavy_optimizer = profiles(std::string(kTorchRuntime), 0);
  heavy_optimizer[1].optimizer_transient = 10 * kHeavy;
  heavy_optimizer[3].optimizer_transient = 10 * kHeavy;
  const Prediction prediction =
      predict_peaks(v_schedule(true), heavy_optimizer, options_for(true, ReceiveBuffers::pooled));
  // After the step every send is let go, but the input leaves of stage 1 (2 x 100) and of stage
  // 3 on rank 0 (2 x 10000) keep the gradients I put into .grad through the optimizer step.
  // Stage 2's handed input leaves were dropped with their gradients by the pool.
  const RankPrediction& turn = prediction.per_rank.at(1);
  EXPECT_EQ(turn.action, "optimizer step");
  EXPECT_EQ(turn.parts.held_for_sends, 2u * 100);
  // Rank 0 also keeps the last stage's outputs (2 x 1) for the merged output.
  const RankPrediction& ends = prediction.per_rank.at(0);
  EXPECT_EQ(ends.action, "optimizer step");
  EXPECT_EQ(ends.parts.held_for_sends, 2u * 10000 + 2 * 1);
}

TEST(PredictVTurn, PooledFullBackwardLeavesTheHandedInputToTheSentOutputsGraphUntilTheStepEnds) {
  const RankPrediction rank = turn_rank(/*split=*/false, ReceiveBuffers::pooled, std::string(kTorchRuntime), 1000);
  // 1F0 1F1 2F0 2F1 2B0 2B1 1B0 1B1; 1B0 creates stage 1's gradients (1000), so that 1B1 is
  // the peak. At 1B1: stage 1's output of microbatch 0 outlives 1B0,
  // held through stage 2's graph by stage 2's sent output (1 x 1000); microbatch 1's is still
  // in stage 1's activations (1000). Stage 2's sent outputs (2 x 10000), stage 1's sent input
  // gradient of microbatch 0 (100); stage 2's handed-back gradient of microbatch 0 was let go
  // at 1B0, microbatch 1's is read by 1B1 (1000).
  EXPECT_EQ(rank.action, "1B1");
  EXPECT_EQ(rank.parts.grads, 1000u);
  EXPECT_EQ(rank.parts.activations, 1000u);
  EXPECT_EQ(rank.parts.held_for_sends, 1000u + 2 * 10000 + 100 + 1000);
}

TEST(PredictVTurn, StockFullBackwardCountsTheHandoffsOnceAsReceiveSets) {
  const RankPrediction rank = turn_rank(/*split=*/false, ReceiveBuffers::stock);
  // At 1B1 with stock buffers the handed-on output of microbatch 0 is in the receive records
  // (it stays there until the next step), not pinned a second time by stage 2's graph.
  EXPECT_EQ(rank.action, "1B1");
  EXPECT_EQ(rank.parts.receive_buffers, 2u * 100 + 2 * 10000 + 1000 + 2 * 1000);
  EXPECT_EQ(rank.parts.held_for_sends, 2u * 10000 + 100);
}

TEST(PredictVTurn, RematRuntimeHoldsNoHandoffPastItsReaderNorAnyGradientPastTheStep) {
  const RankPrediction rank = turn_rank(/*split=*/true, ReceiveBuffers::stock, std::string(kRematRuntime));
  // remat::pipeline drops the forward state at I and keeps every input gradient (2 x 100 sent,
  // 2 x 1000 handed back) and sent output (2 x 10000) until the step's end; no stock handoff
  // sets, no .grad kept. At 1W0 stage 1 keeps what I left for W (2 x 1000).
  EXPECT_EQ(rank.action, "1W0");
  EXPECT_EQ(rank.parts.receive_buffers, 2u * 100 + 2 * 10000);
  EXPECT_EQ(rank.parts.held_for_sends, 2u * 100 + 2 * 1000 + 2 * 10000);
  EXPECT_EQ(rank.parts.activations, 2u * 1000);
}

}  // namespace
}  // namespace remat::pipeline
