// Step peaks of plans from a step's memory: sets of storages, not sums (a checkpoint's output that
// is the next one's input counts once), what recompute brings back in a checkpoint's backward, and
// the least peak named where a budget is below it.

#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <gtest/gtest.h>

#include "random_step.hpp"
#include "two_checkpoints.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace remat::budget {
namespace {

using fixtures::two_checkpoints;

TEST(StepPeak, EverythingSavedPredictsWhatTheProfiledStepMeasured) {
  const RegionProfile profile = two_checkpoints();
  EXPECT_EQ(predict_step_peak(profile, {Choice::save, Choice::save}), 300u);
}

TEST(StepPeak, AnOutputThatIsTheNextCheckpointsInputCountsOnce) {
  const RegionProfile profile = two_checkpoints();
  // c1 recomputed keeps its input out0, which c0 keeps as its output already: nothing is freed at
  // c1's backward, where recompute brings back out1 and s1.
  EXPECT_EQ(predict_step_peak(profile, {Choice::save, Choice::recompute}), 300u);
  // c0 recomputed keeps nothing (its input is a leaf); c0's backward peaks where it recomputes.
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::save}), 200u);
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::recompute}), 290u);
}

TEST(StepPeak, ThePlanIsTheLeastRecomputeWithinThePeakAndNamesItsPrediction) {
  const RegionProfile profile = two_checkpoints();
  const Plan plan = solve_peak(profile, 250);
  EXPECT_EQ(plan.peak_bytes, 200u);
  EXPECT_EQ(plan.peak_budget_bytes, 250u);
  EXPECT_EQ(plan.recompute_seconds, 1.0);
  EXPECT_EQ(plan.regions[0].second, Choice::recompute);
  EXPECT_EQ(plan.regions[1].second, Choice::save);
  EXPECT_TRUE(plan.exact);
  EXPECT_EQ(solve_peak(profile, 300).recompute_seconds, 0.0);
  EXPECT_EQ(least_step_peak(profile), 200u);
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  EXPECT_EQ(plan_from_json(plan_to_json(solve_peak(read, 250)), "plan").peak_bytes, 200u);
}

TEST(StepPeak, ABudgetBelowEveryPlansPeakNamesTheLeastAndWhatItIsMadeOf) {
  RegionProfile profile = two_checkpoints();
  profile.step->start_bytes = 50;
  profile.step->end_bytes = 150;
  try {
    solve_peak(profile, 199);
    FAIL() << "a peak below every plan's was accepted";
  } catch (const BudgetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the least any plan reaches is 200 B (200 bytes)"), std::string::npos) << message;
    EXPECT_NE(message.find("the batch: 150 B (150 bytes)) is 75% of it: recompute cannot reduce that part"),
              std::string::npos)
        << message;
  }
}

TEST(StepPeak, AProfileWithoutStepMemoryCannotPlanByPeak) {
  RegionProfile profile = two_checkpoints();
  profile.step.reset();
  EXPECT_THROW(solve_peak(profile, 1000), BudgetError);
}

TEST(StepPeak, ADumpNamingAStorageThatIsNotThereIsRefused) {
  RegionProfile profile = two_checkpoints();
  profile.step->checkpoints[1].regions[0].kept.push_back(9);
  try {
    profile_from_json(profile_to_json(profile), "p.json");
    FAIL() << "accepted";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("p.json: $.step: $.step.checkpoints[1].regions[0].kept: storage 9 is "
                        "not among the step's 4 storages"),
              std::string::npos)
        << error.what();
  }
}

// c1's body makes h (storage 4) from its input out0 outside its region, which takes h: where the
// plan recomputes the region, recompute runs that code again and the runtime keeps out0 for it.
// A profile notes what that code reads (body_inputs); an older one without it counts every input.
TEST(StepPeak, InputsTheCodeOutsideTheRegionsReadsAreKeptWhereTheCallRecomputes) {
  RegionProfile profile = two_checkpoints();
  profile.step->storages.push_back(100);  // h
  profile.step->checkpoints[1].regions[0].inputs = {4};
  const std::vector<Choice> recomputed{Choice::recompute, Choice::recompute};
  const std::uint64_t unnoted = predict_step_peak(profile, recomputed);
  profile.step->checkpoints[1].body_inputs = std::vector<std::uint32_t>{0};
  EXPECT_EQ(predict_step_peak(profile, recomputed), unnoted);
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  ASSERT_TRUE(read.step->checkpoints[1].body_inputs.has_value());
  EXPECT_EQ(*read.step->checkpoints[1].body_inputs, std::vector<std::uint32_t>{0});
  EXPECT_FALSE(read.step->checkpoints[0].body_inputs.has_value());
  EXPECT_EQ(unnoted, 290u);  // c1's backward: 300 measured, less s0 (c0 recomputes), out0 kept by c1
  // Read by nothing outside the region: c1 keeps none of it, and its backward holds 190 (out1 and
  // what recompute brings back), below c0's backward (200)
  profile.step->checkpoints[1].body_inputs = std::vector<std::uint32_t>{};
  EXPECT_EQ(predict_step_peak(profile, recomputed), 200u);
  // Saved, the call keeps no input for recompute either way
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::save}),
            predict_step_peak(read, {Choice::recompute, Choice::save}));
}

TEST(StepPeak, ADumpWhoseBodyInputsAreNotAmongTheCallsInputsIsRefused) {
  RegionProfile profile = two_checkpoints();
  profile.step->checkpoints[1].body_inputs = std::vector<std::uint32_t>{2};
  try {
    profile_from_json(profile_to_json(profile), "p.json");
    FAIL() << "accepted";
  } catch (const BudgetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("$.step.checkpoints[1].body_inputs: storage 2 is not among the call's inputs"),
              std::string::npos)
        << message;
  }
}

std::string refusal_of(const RegionProfile& profile) {
  try {
    profile_from_json(profile_to_json(profile), "p.json");
  } catch (const BudgetError& error) {
    return error.what();
  }
  return "accepted";
}

// A byte figure no step has (2^64-1 wrapped the peak's sums into a small, wrong peak) is refused
// by the reader, naming the field.
TEST(StepPeak, ADumpOfAByteFigurePastAPebibyteIsRefusedNamingTheField) {
  constexpr std::uint64_t kHuge = ~std::uint64_t{0};
  const std::string past = " bytes, past 1125899906842624 (1 PiB), which no step allocates";
  RegionProfile profile = two_checkpoints();
  profile.step->checkpoints[1].regions[0].transient_bytes = kHuge;
  EXPECT_EQ(refusal_of(profile).rfind(
                "p.json: $.step.checkpoints[1].regions[0].transient_bytes: is " + std::to_string(kHuge) + past, 0),
            0u)
      << refusal_of(profile);
  profile = two_checkpoints();
  profile.step->storages[2] = (std::uint64_t{1} << 50) + 1;
  EXPECT_NE(refusal_of(profile).find("p.json: $.step.storages[2]: is 1125899906842625" + past), std::string::npos)
      << refusal_of(profile);
  profile = two_checkpoints();
  profile.step->segments[1].peak_bytes = kHuge;
  EXPECT_NE(refusal_of(profile).find("$.step.segments[1].peak_bytes: is"), std::string::npos) << refusal_of(profile);
  profile = two_checkpoints();
  profile.step->storages[2] = std::uint64_t{1} << 50;  // the bound itself is read
  EXPECT_EQ(refusal_of(profile), "accepted");
}

TEST(StepPeak, ADumpOfAStepWithoutSegmentsIsRefused) {
  RegionProfile profile = two_checkpoints();
  profile.step->segments.clear();
  EXPECT_EQ(refusal_of(profile),
            "p.json: $.step.segments: is empty, but a profiled step has at least one segment (from its start to its "
            "end) and no step peak is predicted without: profile the step again");
}

// A step made in memory (not read from a dump) whose figures add up past 2^64 is refused, not
// wrapped into a small peak.
TEST(StepPeak, FiguresAddingUpPastSixtyFourBitsAreRefusedRatherThanWrapped) {
  RegionProfile profile = two_checkpoints();
  profile.step->storages[0] = std::uint64_t{1} << 63;
  profile.step->storages[2] = std::uint64_t{1} << 63;
  try {
    predict_step_peak(profile, {Choice::save, Choice::save});
    FAIL() << "a wrapped peak was predicted";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("the step's byte figures add up past 64 bits"), std::string::npos)
        << error.what();
  }
  profile = two_checkpoints();
  profile.step->segments[2].start_bytes = ~std::uint64_t{0} - 5;
  profile.step->segments[2].peak_bytes = ~std::uint64_t{0} - 5;
  profile.step->checkpoints[0].regions[0].transient_bytes = 10;  // start + transient of c0's recompute
  EXPECT_THROW(predict_step_peak(profile, {Choice::recompute, Choice::save}), BudgetError);
}

// Autocast's cache holds the casts of leaves (a weight cast to bfloat16) until its block ends: a
// region a plan recomputes frees its casts only once backward begins, not in the forward (only
// once the backward ends where it began inside the block), or where the profile saw the cache cleared.
TEST(StepPeak, CastsAutocastHoldsStayThroughTheForwardWhateverThePlan) {
  RegionProfile profile = two_checkpoints();
  profile.step->peak_bytes = profile.step->segments[0].peak_bytes = 400;  // the forward's end: the loss
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::save}), 290u);
  profile.step->checkpoints[0].regions[0].autocast_cached = {1};  // s0 is such a cast
  // c0 recomputed: s0 held at the forward's end (400 less out0's 100), freed in c0's backward
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::save}), 300u);
  EXPECT_EQ(predict_step_peak(profile, {Choice::save, Choice::recompute}), 390u);  // c0 keeps it anyway
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  EXPECT_EQ(read.step->checkpoints[0].regions[0].autocast_cached, std::vector<std::uint32_t>{1});
  EXPECT_EQ(predict_step_peak(read, {Choice::recompute, Choice::save}), 300u);
  // The backward began inside the autocast block: s0 stays through c1's backward too (300 there
  // with every region recomputed, where it was freed when backward began: 290), and reads back.
  profile.step->peak_bytes = profile.step->segments[0].peak_bytes = 220;
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::recompute}), 290u);
  profile.step->autocast_held_in_backward = true;
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::recompute}), 300u);
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::save}), 200u);  // c0's backward: s0 recomputed
  EXPECT_EQ(predict_step_peak(profile_from_json(profile_to_json(profile), "profile"),
                              {Choice::recompute, Choice::recompute}),
            300u);
  // A clear seen where c1's backward begins frees s0 there, wherever the backward began
  profile.step->autocast_cleared = {1};
  EXPECT_EQ(predict_step_peak(profile, {Choice::recompute, Choice::recompute}), 290u);
  EXPECT_EQ(profile_from_json(profile_to_json(profile), "profile").step->autocast_cleared,
            std::vector<std::uint32_t>{1});
  profile.step->autocast_cleared = {2, 1};
  EXPECT_NE(refusal_of(profile).find("$.step.autocast_cleared[1]: segment 1 is not after the one before it"),
            std::string::npos)
      << refusal_of(profile);
  profile.step->autocast_cleared = {3};
  EXPECT_NE(refusal_of(profile).find("$.step.autocast_cleared[0]: segment 3 is not one of the step's segments 1 to 2"),
            std::string::npos)
      << refusal_of(profile);
  const std::vector<StepSegment> segments = profile.step->segments;
  profile.step->segments.resize(1);  // no segment after the first: none a clear may begin
  EXPECT_NE(
      refusal_of(profile).find("segment 3 is not one of the step's segments after the first: it has 1 segment(s)"),
      std::string::npos)
      << refusal_of(profile);
  profile.step->segments = segments;
  profile.step->autocast_cleared.clear();
  std::string text = profile_to_json(profile);
  const std::size_t flag = text.find("true", text.find("\"autocast_held_in_backward\""));
  ASSERT_NE(flag, std::string::npos) << text;
  try {
    profile_from_json(text.replace(flag, 4, "1"), "p.json");
    FAIL() << "a flag of 1 was accepted";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("$.step.autocast_held_in_backward: must be true or false, got 1"),
              std::string::npos)
        << error.what();
  }
  profile.step->checkpoints[0].regions[0].autocast_cached = {7};
  EXPECT_NE(refusal_of(profile).find("$.step.checkpoints[0].regions[0].autocast_cached: storage 7 is not among"),
            std::string::npos)
      << refusal_of(profile);
}

// A backward run with create_graph=True makes a graph that holds what recompute made there (what
// the regions' ops saved); the graph of the first backward is retained, and a second backward
// recomputes again beside it.
TEST(StepPeak, WhatABackwardThatCreatesAGraphHoldsOfRecomputeIsCountedUntilTheLaterBackward) {
  RegionProfile profile = two_checkpoints();
  StepMemory& step = *profile.step;
  // Both backwards keep both calls live until c0's second one
  step.segments = {{220, 0, {0, 1}, -1, -1},   {300, 220, {0, 1}, -1, 1}, {230, 220, {0, 1}, -1, 0},
                   {300, 220, {0, 1}, -1, 1}, {200, 110, {0}, -1, 0}};
  EXPECT_EQ(predict_step_peak(profile, {Choice::save, Choice::recompute}), 300u);
  step.checkpoints[1].create_graph_backwards = {{1u, 3u}};
  step.checkpoints[1].regions[0].saved = {3};  // s1: out1 is no op's
  // s1 made again in c1's second backward beside the first backward's copy
  EXPECT_EQ(predict_step_peak(profile, {Choice::save, Choice::recompute}), 310u);
  EXPECT_EQ(predict_step_peak(profile, {Choice::save, Choice::save}), 300u);
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  EXPECT_EQ(read.step->checkpoints[1].create_graph_backwards,
            (std::vector<std::pair<std::uint32_t, std::uint32_t>>{{1, 3}}));
  EXPECT_EQ(read.step->checkpoints[1].regions[0].saved, std::vector<std::uint32_t>{3});
  EXPECT_EQ(predict_step_peak(read, {Choice::save, Choice::recompute}), 310u);
  // Freed where the profiled step freed it (in c1's second backward's segment): no longer beside there
  step.freed_in = {-1, -1, -1, 3};
  EXPECT_EQ(predict_step_peak(profile, {Choice::save, Choice::recompute}), 300u);
  step.checkpoints[1].regions[0].saved = {7};
  EXPECT_NE(refusal_of(profile).find("$.step.checkpoints[1].regions[0].saved: storage 7 is not among"),
            std::string::npos)
      << refusal_of(profile);
  step.checkpoints[1].regions[0].saved = {3};
  step.checkpoints[1].create_graph_backwards = {{1u, 9u}};
  EXPECT_NE(refusal_of(profile).find("$.step.checkpoints[1].create_graph_backwards[0]: segment 9 is past the step's 5"),
            std::string::npos)
      << refusal_of(profile);
  step.checkpoints[1].create_graph_backwards = {{1u, 3u}};
  std::string text = profile_to_json(profile);
  const std::size_t at = text.find("[1,3]", text.find("\"create_graph_backwards\""));
  ASSERT_NE(at, std::string::npos) << text;
  try {
    profile_from_json(text.replace(at, 5, "[3,1]"), "p.json");
    FAIL() << "a backward ending before it began was accepted";
  } catch (const BudgetError& error) {
    EXPECT_NE(
        std::string(error.what()).find("$.step.checkpoints[1].create_graph_backwards[0]: must be two segment numbers"),
        std::string::npos)
        << error.what();
  }
}

// The search takes plans by their recompute time and stops after the fastest within the peak: on
// small random steps with pinned regions, the same plan as weighing every plan, and the least peak
// of them all.
TEST(StepPeak, TheSearchFindsTheBestOfEveryPlanOnSmallRandomSteps) {
  std::mt19937_64 rng(47);
  int planned = 0, refused = 0;
  for (int trial = 0; trial < 150; ++trial) {
    RegionProfile profile = fixtures::random_step(rng, {1 + rng() % 4, 3, trial % 2 == 0}, [](auto&&...) {});
    for (RegionCost& region : profile.regions) {
      if (region.must_save.empty() && rng() % 8 == 0) region.must_recompute = "a test pin";
    }
    const std::size_t n = profile.regions.size();
    std::uint64_t least = UINT64_MAX;
    std::vector<std::pair<std::uint64_t, double>> plans;  // (peak, seconds) of each plan the pins allow
    for (std::uint64_t mask = 0; mask < (std::uint64_t{1} << n); ++mask) {
      std::vector<Choice> choices(n);
      double seconds = 0;
      bool pinned = true;
      for (std::size_t r = 0; r < n; ++r) {
        const bool recompute = (mask >> r) & 1;
        choices[r] = recompute ? Choice::recompute : Choice::save;
        pinned =
            pinned && !(recompute ? !profile.regions[r].must_save.empty() : !profile.regions[r].must_recompute.empty());
        if (recompute) seconds += profile.regions[r].seconds;
      }
      if (!pinned) continue;
      plans.emplace_back(predict_step_peak(profile, choices), seconds);
      least = std::min(least, plans.back().first);
    }
    EXPECT_EQ(least_step_peak(profile), least) << trial;
    const std::uint64_t most = profile.step->peak_bytes + 500;
    const std::uint64_t peak = rng() % 6 == 0 ? least - 1 : least + rng() % (most - least + 1);
    double best = -1;
    for (const auto& [plan_peak, seconds] : plans) {
      if (plan_peak <= peak && (best < 0 || seconds < best)) best = seconds;
    }
    if (best < 0) {
      EXPECT_THROW(solve_peak(profile, peak), BudgetError) << trial;
      ++refused;
      continue;
    }
    const Plan plan = solve_peak(profile, peak);
    ASSERT_TRUE(plan.exact) << trial;
    EXPECT_NEAR(plan.recompute_seconds, best, 1e-9 * (1 + best)) << trial;
    EXPECT_LE(plan.peak_bytes, peak) << trial;
    EXPECT_EQ(plan.peak_bytes, predict_step_peak(profile, choices_of(plan))) << trial;
    ++planned;
  }
  EXPECT_GT(planned, 100);
  EXPECT_GT(refused, 5);
}

// Whether some plan one move from `plan` (a region recomputed saved instead, or that and another
// region's choice changed) is faster and fits `peak`; the plan's peak search stops only where none
// is (or at its limit of plans weighed, which these small steps stay far within).
bool a_faster_move_fits(const RegionProfile& profile, const Plan& plan, std::uint64_t peak) {
  const std::vector<Choice> choices = choices_of(plan);
  const auto pinned = [&](std::size_t r) {
    return !profile.regions[r].must_save.empty() || !profile.regions[r].must_recompute.empty();
  };
  for (std::size_t r = 0; r < choices.size(); ++r) {
    if (choices[r] != Choice::recompute || pinned(r)) continue;
    std::vector<Choice> moved = choices;
    moved[r] = Choice::save;
    if (predict_step_peak(profile, moved) <= peak) return true;
    for (std::size_t q = 0; q < choices.size(); ++q) {
      if (q == r || pinned(q)) continue;
      std::vector<Choice> both = moved;
      both[q] = both[q] == Choice::save ? Choice::recompute : Choice::save;
      const double seconds = plan.recompute_seconds - profile.regions[r].seconds +
                             (both[q] == Choice::recompute ? profile.regions[q].seconds : -profile.regions[q].seconds);
      if (seconds < plan.recompute_seconds - 1e-12 && predict_step_peak(profile, both) <= peak) return true;
    }
  }
  return false;
}

TEST(StepPeak, BeyondSixteenRegionsNoPlanOneOrTwoChoicesAwayIsFasterAndFits) {
  std::mt19937_64 rng(52);
  int planned = 0, recomputing = 0;
  for (int trial = 0; trial < 20; ++trial) {
    RegionProfile profile;
    do {
      profile = fixtures::random_step(rng, {8 + rng() % 6, 3, trial % 2 == 0}, [](auto&&...) {});
    } while (profile.regions.size() <= 16 || profile.regions.size() > 30);
    const std::uint64_t least = least_step_peak(profile);
    const Plan at_least = solve_peak(profile, least);  // a plan at the least peak the search names
    EXPECT_EQ(at_least.peak_bytes, least) << trial;
    const std::uint64_t peak = least + (profile.step->peak_bytes - least) * (1 + rng() % 3) / 4;
    const Plan plan = solve_peak(profile, peak);
    EXPECT_LE(plan.peak_bytes, peak) << trial;
    EXPECT_EQ(plan.peak_bytes, predict_step_peak(profile, choices_of(plan))) << trial;
    EXPECT_FALSE(a_faster_move_fits(profile, plan, peak)) << trial;
    ++planned;
    recomputing += plan.recompute_seconds > 0 ? 1 : 0;
  }
  EXPECT_EQ(planned, 20);
  EXPECT_GT(recomputing, 15);  // the plans have choices to make
}

}  // namespace
}  // namespace remat::budget
