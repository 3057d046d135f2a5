// predict_peaks on a case small enough to walk by hand: 2 stages on 2 ranks, 3 microbatches,
// stock receive buffers, PyTorch's own loops (ScheduleGPipe, Schedule1F1B), then the same
// profiles under remat::pipeline's runtime. Every expected figure below is a sum of profile
// figures worked out from the rules in predict.cpp's opening comment, not read back from the
// code. Then the inputs a user gets wrong.

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/predict.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace remat::pipeline {
namespace {

constexpr int kMicrobatches = 3;

// Gradients are kept small beside the activations, so that the peak falls where the
// activations in flight differ between GPipe and 1F1B rather than at the first backward.
StageProfile first_stage() {
  return stage_profile_of("toy", 0, 2, "cpu",
                          {{"params", 1000},
                           {"grads", 100},
                           {"optimizer_state", 2000},
                           {"optimizer_transient", 100},
                           {"input_bytes", 100},
                           {"target_bytes", 0},
                           {"output_bytes", 200},
                           {"input_grad_bytes", 0},
                           {"loss_bytes", 0},
                           {"forward_kept", 300},
                           {"forward_transient", 50},
                           {"backward_transient", 70},
                           {"input_backward_kept", 300},
                           {"input_backward_transient", 70},
                           {"weight_backward_transient", 0}});
}

StageProfile last_stage() {
  return stage_profile_of("toy", 1, 2, "cpu",
                          {{"params", 4000},
                           {"grads", 400},
                           {"optimizer_state", 8000},
                           {"optimizer_transient", 500},
                           {"input_bytes", 200},
                           {"target_bytes", 10},
                           {"output_bytes", 20},
                           {"input_grad_bytes", 200},
                           {"loss_bytes", 4},
                           {"forward_kept", 600},
                           {"forward_transient", 90},
                           {"backward_transient", 150},
                           {"input_backward_kept", 600},
                           {"input_backward_transient", 150},
                           {"weight_backward_transient", 0}});
}

Prediction predict_step_loop(ScheduleKind kind, const std::string& name) {
  const Schedule lowered = lower_single_stage_step(kind, {2, {}, kMicrobatches});
  PredictOptions options;
  options.schedule_name = name;
  options.lowering = "step";
  return predict_peaks(lowered, {first_stage(), last_stage()}, options);
}

void expect_parts(const PeakParts& got, const PeakParts& want) {
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.grads, want.grads);
  EXPECT_EQ(got.optimizer_state, want.optimizer_state);
  EXPECT_EQ(got.activations, want.activations);
  EXPECT_EQ(got.receive_buffers, want.receive_buffers);
  EXPECT_EQ(got.held_for_sends, want.held_for_sends);
  EXPECT_EQ(got.batch, want.batch);
  EXPECT_EQ(got.transient, want.transient);
}

// The rank's predicted peak, the action at which it happens, and its parts there.
void expect_peak(const RankPrediction& rank, std::uint64_t peak, const std::string& action, const PeakParts& parts) {
  EXPECT_EQ(rank.peak, peak);
  EXPECT_EQ(rank.action, action);
  expect_parts(rank.parts, parts);
}

std::string refusal(const Schedule& lowered, const std::vector<StageProfile>& profiles) {
  try {
    predict_peaks(lowered, profiles, PredictOptions{});
  } catch (const PlanError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(PredictPeaks, GPipeFirstRankPeaksAtItsFirstBackwardWithEveryMicrobatchInFlight) {
  const RankPrediction rank = predict_step_loop(ScheduleKind::gpipe, "gpipe").per_rank.at(0);
  // F0 F1 F2 then B0: three microbatches' activations, no gradients yet (they appear at B0's
  // end), stock gradient buffers for 3 microbatches of stage 0's output, the batch's 3 inputs.
  const PeakParts want{.params = 1000, .optimizer_state = 2000, .activations = 3 * 300, .receive_buffers = 3 * 200,
                       .batch = 3 * 100, .transient = 70};
  EXPECT_EQ(rank.peak, 1000u + 2000 + 900 + 600 + 300 + 70);
  EXPECT_EQ(rank.peak, 4870u);
  EXPECT_EQ(rank.action, "0B0");
  EXPECT_EQ(rank.in_flight, 3);
  EXPECT_EQ(rank.stages, std::vector<int>{0});
  expect_parts(rank.parts, want);
}

TEST(PredictPeaks, OneFOneBFirstRankHoldsTwoMicrobatchesAtMostAndPeaksAtItsSecondBackward) {
  const RankPrediction rank = predict_step_loop(ScheduleKind::one_f_one_b, "1f1b").per_rank.at(0);
  // F0 F1 B0 F2 B1 B2: at B0 two in flight and no gradients (4570); at B1 two in flight
  // (microbatches 1 and 2) and stage 0's gradients: 100 more.
  const PeakParts want{.params = 1000, .grads = 100, .optimizer_state = 2000, .activations = 2 * 300,
                       .receive_buffers = 3 * 200, .batch = 3 * 100, .transient = 70};
  expect_peak(rank, 4670, "0B1", want);
  EXPECT_EQ(rank.in_flight, 2);
}

TEST(PredictPeaks, GPipeLastRankHoldsItsInputGradientsUntilTheStepEnds) {
  const RankPrediction rank = predict_step_loop(ScheduleKind::gpipe, "gpipe").per_rank.at(1);
  // At B1: microbatches 1 and 2 in flight; microbatch 0's output and loss kept for the merged
  // output (20 + 4), its input gradient held by its send, which GPipe waits for at the end (200).
  const PeakParts want{.params = 4000, .grads = 400, .optimizer_state = 8000, .activations = 2 * 600,
                       .receive_buffers = 3 * 200, .held_for_sends = 20 + 4 + 200, .batch = 3 * 10, .transient = 150};
  expect_peak(rank, 14604, "1B1", want);
  EXPECT_EQ(rank.in_flight, 2);
}

TEST(PredictPeaks, OneFOneBLastRankLetsEachInputGradientGoAtItsSend) {
  const RankPrediction rank = predict_step_loop(ScheduleKind::one_f_one_b, "1f1b").per_rank.at(1);
  // F0 B0 F1 B1 F2 B2: one microbatch in flight at a time; at B2 the outputs and losses of
  // microbatches 0 and 1 are kept, their input gradients already sent and waited for.
  const PeakParts want{.params = 4000, .grads = 400, .optimizer_state = 8000, .activations = 600,
                       .receive_buffers = 3 * 200, .held_for_sends = 2 * (20 + 4), .batch = 3 * 10, .transient = 150};
  expect_peak(rank, 13828, "1B2", want);
  EXPECT_EQ(rank.in_flight, 1);
}

TEST(PredictPeaks, TheOptimizerStepIsThePeakWhenItsTransientOutweighsABackward) {
  StageProfile heavy = last_stage();
  heavy.optimizer_transient = 5000;
  const Schedule lowered = lower_single_stage_step(ScheduleKind::one_f_one_b, {2, {}, kMicrobatches});
  PredictOptions options;
  options.schedule_name = "1f1b";
  options.lowering = "step";
  const RankPrediction rank = predict_peaks(lowered, {first_stage(), heavy}, options).per_rank.at(1);
  // After the step: params, grads, state, buffers, every output and loss (3 * 24), the targets.
  EXPECT_EQ(rank.peak, 4000u + 400 + 8000 + 600 + 72 + 30 + 5000);
  EXPECT_EQ(rank.action, "optimizer step");
  EXPECT_EQ(rank.position, -1);
  EXPECT_EQ(rank.parts.activations, 0u);
}

// remat::pipeline's PipelineRuntime runs lower_schedule's order:
//   rank 0: 0F0 0SEND_F0 0RECV_B0 0F1 0SEND_F1 0B0 0RECV_B1 0F2 0SEND_F2 0B1 0RECV_B2 0B2
//   rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2
// and waits every send at the step's end, keeps input gradients until then, and keeps only
// the last stage's losses.
Prediction predict_remat_runtime(ReceiveBuffers buffers, int slack) {
  StageProfile first = first_stage();
  StageProfile last = last_stage();
  first.runtime = last.runtime = std::string(kRematRuntime);
  const Schedule lowered = lower_schedule(generate_schedule(ScheduleKind::one_f_one_b, {2, {}, kMicrobatches}));
  PredictOptions options;
  options.schedule_name = "1f1b";
  options.lowering = "add-send-recv";
  options.buffers = buffers;
  options.slack = slack;
  return predict_peaks(lowered, {first, last}, options);
}

TEST(PredictPeaks, RematRuntimeHoldsSentOutputsUntilTheStepEnds) {
  const RankPrediction rank = predict_remat_runtime(ReceiveBuffers::stock, 2).per_rank.at(0);
  // At B1 as under PyTorch's Schedule1F1B, and microbatch 0's output (200) still held by its send.
  const PeakParts want{.params = 1000, .grads = 100, .optimizer_state = 2000, .activations = 2 * 300,
                       .receive_buffers = 3 * 200, .held_for_sends = 200, .batch = 3 * 100, .transient = 70};
  expect_peak(rank, 4870, "0B1", want);
}

TEST(PredictPeaks, RematRuntimeKeepsInputGradientsAndLossesButNoOutputs) {
  const RankPrediction rank = predict_remat_runtime(ReceiveBuffers::stock, 2).per_rank.at(1);
  // At B2: microbatches 0 and 1 each leave their loss (4) and input gradient (200); no outputs.
  const PeakParts want{.params = 4000, .grads = 400, .optimizer_state = 8000, .activations = 600,
                       .receive_buffers = 3 * 200, .held_for_sends = 2 * (4 + 200), .batch = 3 * 10, .transient = 150};
  expect_peak(rank, 14188, "1B2", want);
}

TEST(PredictPeaks, RematRuntimeRingsAreTheRuntimesWithItsSlack) {
  // Slack 0: NeMo's ring max(2, min(M, S - s + 0)) is 2 sets on both stages, safe (1 is live at
  // a time), where remat.pipelining's colored ring would be 1.
  const Prediction pooled = predict_remat_runtime(ReceiveBuffers::pooled, 0);
  EXPECT_EQ(pooled.per_rank.at(0).parts.receive_buffers, 2u * 200);
  EXPECT_EQ(pooled.per_rank.at(1).parts.receive_buffers, 2u * 200);
  EXPECT_EQ(pooled.per_rank.at(0).peak, 4870u - 200);
  EXPECT_EQ(pooled.per_rank.at(1).peak, 14188u - 200);
}

TEST(PredictPeaks, RefusesProfilesOfTwoRuntimes) {
  StageProfile last = last_stage();
  last.runtime = std::string(kRematRuntime);
  const std::string message =
      refusal(lower_single_stage_step(ScheduleKind::gpipe, {2, {}, kMicrobatches}), {first_stage(), last});
  EXPECT_NE(message.find("the profile of stage 1 was made for remat::pipeline and that of stage 0 for "
                         "torch.distributed.pipelining"),
            std::string::npos)
      << message;
}

TEST(PredictPeaks, RefusesAStageCountOtherThanTheSchedules) {
  const Schedule lowered = lower_single_stage_step(ScheduleKind::gpipe, {2, {}, kMicrobatches});
  const std::string one = refusal(lowered, {first_stage()});
  EXPECT_NE(one.find("the schedule has 2 stages and 1 stage profiles were given"), std::string::npos) << one;
  EXPECT_NE(one.find("give one profile per stage"), std::string::npos) << one;

  // Profiles of a 3-stage split given to a 2-stage schedule (the right count, the wrong split).
  StageProfile a = first_stage();
  StageProfile b = last_stage();
  a.num_stages = b.num_stages = 3;
  const std::string split = refusal(lowered, {a, b});
  EXPECT_NE(split.find("is of a model split into 3 stages, and the schedule runs 2"), std::string::npos) << split;
}

TEST(PredictPeaks, RefusesZeroMicrobatches) {
  Schedule lowered = lower_single_stage_step(ScheduleKind::gpipe, {2, {}, kMicrobatches});
  lowered.microbatches = 0;
  const std::string message = refusal(lowered, {first_stage(), last_stage()});
  EXPECT_NE(message.find("microbatches is 0; a step runs 1 or more microbatches"), std::string::npos) << message;
}

TEST(PredictPeaks, RefusesProfilesOfAnotherModelOrAnotherBoundary) {
  const Schedule lowered = lower_single_stage_step(ScheduleKind::gpipe, {2, {}, kMicrobatches});
  StageProfile other = last_stage();
  other.model = "other";
  const std::string model = refusal(lowered, {first_stage(), other});
  EXPECT_NE(model.find("of model 'other' and that of stage 0 of model 'toy'"), std::string::npos) << model;

  StageProfile wider = last_stage();
  wider.input_bytes = 400;
  const std::string boundary = refusal(lowered, {first_stage(), wider});
  EXPECT_NE(boundary.find("stage 0 sends 200 bytes per microbatch and stage 1 receives 400 bytes"), std::string::npos)
      << boundary;
}

TEST(PredictPeaks, AProfileWithAFigureMissingOrUnknownIsRefusedByName) {
  EXPECT_THROW(stage_profile_of("toy", 0, 2, "cpu", {{"params", 1}}), PlanError);
  try {
    stage_profile_of("toy", 2, 2, "cpu", {});
    FAIL() << "stage 2 of 2 was accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 2 of 2 stages"), std::string::npos) << e.what();
  }
}

// A step's first backward on a stage creates its parameter gradients, so its peak is not a later
// backward's: GPipe with 1 microbatch runs only that one, and its peak is the rank's.
TEST(PredictPeaks, AStagesFirstBackwardPeaksWithTheGradientsItCreates) {
  StageProfile first = first_stage();
  StageProfile last = last_stage();
  first.first_backward_transient = 400;  // stage 0's 100 bytes of gradients and 300 of temporaries
  last.first_backward_transient = 1000;
  const Schedule one = lower_single_stage_step(ScheduleKind::gpipe, {2, {}, 1});
  PredictOptions options;
  options.schedule_name = "gpipe";
  options.lowering = "step";
  const RankPrediction rank = predict_peaks(one, {first, last}, options).per_rank.at(0);
  // F0 then B0: params, state, one set of gradient buffers (200), one input (100), microbatch
  // 0's activations (300) and B0's first-backward peak (400), above the optimizer step's 3500.
  const PeakParts want{.params = 1000, .optimizer_state = 2000, .activations = 300, .receive_buffers = 200,
                       .batch = 100, .transient = 400};
  expect_peak(rank, 4000, "0B0", want);

  // Two microbatches: B0 creates the gradients (600 of activations in flight, 400 above), B1
  // is a later backward (backward_transient 70 with the gradients held): B0 stays the peak.
  const RankPrediction two =
      predict_peaks(lower_single_stage_step(ScheduleKind::gpipe, {2, {}, 2}), {first, last}, options).per_rank.at(0);
  EXPECT_EQ(two.peak, 1000u + 2000 + 600 + 2 * 200 + 2 * 100 + 400);
  EXPECT_EQ(two.action, "0B0");

  // A profile written before the figure was measured walks as before: B0's backward_transient.
  const RankPrediction old = predict_peaks(one, {first_stage(), last_stage()}, options).per_rank.at(0);
  EXPECT_EQ(old.peak, 1000u + 2000 + 300 + 200 + 100 + 70);
}

TEST(PredictPeaks, TheFirstBackwardFigureSurvivesTheDump) {
  StageProfile first = first_stage();
  first.first_backward_transient = 400;
  const StageProfile read = stage_profile_from_json(stage_profile_to_json(first), "profile.json");
  ASSERT_TRUE(read.first_backward_transient.has_value());
  EXPECT_EQ(*read.first_backward_transient, 400u);
  EXPECT_FALSE(stage_profile_from_json(stage_profile_to_json(first_stage()), "old.json").first_backward_transient);
}

std::string profile_refusal(const std::string& text) {
  try {
    stage_profile_from_json(text, "profile.json");
  } catch (const PlanError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(PredictPeaks, AFigureAbove1PiBIsRefusedNamingItAndTheLimit) {
  const std::string text = stage_profile_to_json(first_stage());
  const std::string huge = "\"params\":18446744073709551615";
  std::string edited = text;
  edited.replace(edited.find("\"params\":1000"), std::string("\"params\":1000").size(), huge);
  const std::string message = profile_refusal(edited);
  EXPECT_NE(message.find("profile.json: $.bytes.params: is 18446744073709551615; a stage's figure is at most "
                         "1125899906842624 bytes (1 PiB)"),
            std::string::npos)
      << message;
  std::map<std::string, std::uint64_t> bytes = {{"params", 1},
                                                {"grads", 1},
                                                {"optimizer_state", 1},
                                                {"optimizer_transient", 1},
                                                {"input_bytes", 1},
                                                {"target_bytes", 0},
                                                {"output_bytes", 1},
                                                {"input_grad_bytes", 0},
                                                {"loss_bytes", 0},
                                                {"forward_kept", std::uint64_t{1} << 63},
                                                {"forward_transient", 1},
                                                {"backward_transient", 1},
                                                {"input_backward_kept", 1},
                                                {"input_backward_transient", 1},
                                                {"weight_backward_transient", 0}};
  try {
    stage_profile_of("toy", 0, 2, "cpu", bytes);
    FAIL() << "forward_kept of 2^63 was accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("'forward_kept' is 9223372036854775808 bytes; a stage's figure is at most "
                                         "1125899906842624 bytes (1 PiB)"),
              std::string::npos)
        << e.what();
  }
}

TEST(PredictPeaks, APeakPast64BitsIsRefusedNamingTheFigureInsteadOfWrapping) {
  // Stage 0's input of 1 PiB for each of 16384 microbatches: a batch of 2^64 bytes.
  StageProfile first = first_stage();
  first.input_bytes = std::uint64_t{1} << 50;
  const Schedule lowered = lower_single_stage_step(ScheduleKind::gpipe, {2, {}, 1 << 14});
  const std::string message = refusal(lowered, {first, last_stage()});
  EXPECT_NE(message.find("rank 0's predicted memory passes 2^64 - 1 bytes (18446744073709551615) with stage 0's "
                         "input_bytes x 16384"),
            std::string::npos)
      << message;
}

std::string prediction_refusal(const Prediction& prediction) {
  try {
    prediction_from_json(prediction_to_json(prediction), "pred.json");
  } catch (const PlanError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(PredictionDump, RefusesAPredictionThatLeavesOutOrAddsARank) {
  const Prediction whole = predict_step_loop(ScheduleKind::one_f_one_b, "1f1b");
  const Prediction read = prediction_from_json(prediction_to_json(whole), "pred.json");
  ASSERT_EQ(read.per_rank.size(), 2u);
  EXPECT_EQ(read.per_rank.at(1).peak, whole.per_rank.at(1).peak);

  Prediction missing = whole;
  missing.per_rank.erase(missing.per_rank.begin());
  const std::string left_out = prediction_refusal(missing);
  EXPECT_NE(left_out.find("pred.json: $.per_rank: has no entry for rank 0 of the prediction's 2 ranks (0..1)"),
            std::string::npos)
      << left_out;

  Prediction extra = whole;
  extra.per_rank.push_back(whole.per_rank.at(0));
  extra.per_rank.back().rank = 7;
  const std::string added = prediction_refusal(extra);
  EXPECT_NE(added.find("$.per_rank[2].rank: is 7 and the prediction is of 2 ranks (0..1)"), std::string::npos) << added;

  Prediction lies = whole;
  lies.ranks = 8;
  const std::string short_of = prediction_refusal(lies);
  EXPECT_NE(short_of.find("has no entry for rank 2 of the prediction's 8 ranks (0..7)"), std::string::npos) << short_of;
}

TEST(PredictionDump, RefusesPartsThatWrapPast64Bits) {
  Prediction wrapped = predict_step_loop(ScheduleKind::one_f_one_b, "1f1b");
  RankPrediction& rank = wrapped.per_rank.at(0);
  rank.parts = PeakParts{};
  rank.parts.params = ~std::uint64_t{0};
  rank.parts.grads = 2;
  rank.peak = 1;  // what the sum wraps to
  const std::string message = prediction_refusal(wrapped);
  EXPECT_NE(message.find("$.per_rank[0].parts: add up past 2^64 - 1 bytes"), std::string::npos) << message;
}


TEST(PredictDumps, KindsAreWrittenKebabCaseAndTheOldUnderscoredSpellingStillReads) {
  const std::string written = stage_profile_to_json(first_stage());
  ASSERT_NE(written.find("\"stage-profile\""), std::string::npos) << written;
  std::string old = written;
  old.replace(old.find("stage-profile"), 13, "stage_profile");
  EXPECT_EQ(stage_profile_from_json(old, "old.json").params, 1000u);
  EXPECT_EQ(stage_profile_from_json(written, "new.json").params, 1000u);
  std::string other = written;
  other.replace(other.find("stage-profile"), 13, "stage.profile");
  try {
    stage_profile_from_json(other, "other.json");
    FAIL() << "a kind of neither spelling was read";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("not 'stage-profile'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace remat::pipeline
