// Per-op plans by step peak: what kept ops hold through the step (the storages they made, from
// their region's return to their call's backward), the plan against every plan of small random
// steps, and what a profile must list for it.

#include <remat/budget/op_plan.hpp>
#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <gtest/gtest.h>

#include "random_step.hpp"
#include "two_checkpoints.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace remat::budget {
namespace {

// two_checkpoints() with two ops c0's region may keep: op 0 made a 40-byte storage its backward does
// not need (freed in the profiled forward), op 1 made s0, which its backward needs.
RegionProfile two_checkpoints_with_ops() {
  RegionProfile profile = fixtures::two_checkpoints();
  profile.step->storages.push_back(40);
  profile.step->checkpoints[0].regions[0].ops = {{0, {4}}, {1, {1}}};
  profile.regions[0].ops = {{0, "aten::mm", 40, 0.5}, {1, "aten::tanh", 10, 0.2}};
  profile.regions[0].op_overhead_seconds = 0.05;
  return profile;
}

TEST(OpPeak, AKeptOpHoldsWhatItMadeThroughTheStepAndAStorageKeptAnywayCountsOnce) {
  const RegionProfile profile = two_checkpoints_with_ops();
  const std::vector<Choice> c0_recomputed{Choice::recompute, Choice::save};
  EXPECT_EQ(predict_step_peak(profile, c0_recomputed), 200u);
  EXPECT_EQ(predict_step_peak(profile, c0_recomputed, KeptOps{{}, {}}), 200u);
  // op 0's 40 bytes stay from forward until c0's backward, whose recompute takes them back (and lets
  // them go: c0's backward does not need them): c1's backward peaks at 300 - 110 + 40.
  EXPECT_EQ(predict_step_peak(profile, c0_recomputed, KeptOps{{0}, {}}), 230u);
  // s0 is what c0's backward needs: recompute would make it again, so keeping it adds nothing there.
  EXPECT_EQ(predict_step_peak(profile, c0_recomputed, KeptOps{{1}, {}}), 200u);
  EXPECT_EQ(predict_step_peak(profile, c0_recomputed, KeptOps{{0, 1}, {}}), 240u);
  EXPECT_THROW(predict_step_peak(profile, {Choice::save, Choice::save}, KeptOps{{0}, {}}), BudgetError);
}

TEST(OpPeak, ThePlanKeepsTheOpsThatFitThePeakAndNamesItsPrediction) {
  const RegionProfile profile = two_checkpoints_with_ops();
  EXPECT_EQ(solve_peak_ops(profile, 300).recompute_seconds, 0.0);  // everything saved
  // Below it, c0 recomputes keeping both ops (1.0 - 0.7 + 2 x 0.05 s, 240 bytes), then op 0 alone
  // (1.0 - 0.5 + 0.1 s, 230 bytes), then op 1 alone (1.0 - 0.2 + 0.1 s, 200 bytes).
  const Plan both = solve_peak_ops(profile, 299);
  EXPECT_TRUE(both.exact);
  EXPECT_EQ(both.regions[0].second, Choice::recompute);
  EXPECT_EQ(both.regions[1].second, Choice::save);
  ASSERT_EQ(both.kept_ops.size(), 2u);
  EXPECT_EQ(both.kept_ops[0].size(), 2u);
  EXPECT_DOUBLE_EQ(both.recompute_seconds, 1.0 - 0.7 + 0.1);
  EXPECT_EQ(both.peak_bytes, 240u);
  EXPECT_EQ(both.peak_budget_bytes, 299u);
  const Plan first = solve_peak_ops(profile, 239);
  ASSERT_EQ(first.kept_ops.size(), 2u);
  ASSERT_EQ(first.kept_ops[0].size(), 1u);
  EXPECT_EQ(first.kept_ops[0][0].index, 0u);
  EXPECT_DOUBLE_EQ(first.recompute_seconds, 1.0 - 0.5 + 0.1);
  EXPECT_EQ(first.peak_bytes, 230u);
  const Plan second = solve_peak_ops(profile, 229);
  ASSERT_EQ(second.kept_ops.size(), 2u);
  ASSERT_EQ(second.kept_ops[0].size(), 1u);
  EXPECT_EQ(second.kept_ops[0][0].index, 1u);
  EXPECT_DOUBLE_EQ(second.recompute_seconds, 1.0 - 0.2 + 0.1);
  EXPECT_EQ(second.peak_bytes, 200u);
  EXPECT_EQ(second.kept_bytes, profile.base_bytes + 110 + 10);  // c1 saved, op 1's bytes
  try {
    solve_peak_ops(profile, 199);
    FAIL() << "a peak below every plan's was planned";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("the least any plan reaches is 200 B"), std::string::npos) << error.what();
  }
  // The plan dump keeps what it predicts and which ops it keeps.
  const Plan read = plan_from_json(plan_to_json(both), "plan");
  EXPECT_EQ(read.peak_bytes, 240u);
  EXPECT_EQ(read.kept_ops[0].size(), 2u);
}

TEST(OpPeak, AStepWithoutItsOpsIsRefusedNamingTheOpAndHowToProfileIt) {
  RegionProfile profile = two_checkpoints_with_ops();
  profile.step->checkpoints[0].regions[0].ops.pop_back();
  try {
    solve_peak_ops(profile, 400);
    FAIL() << "a step that does not list op 1 was planned";
  } catch (const BudgetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("does not list op 1 (aten::tanh) of region 'c0::r'"), std::string::npos) << message;
    EXPECT_NE(message.find("remat.profile_regions(ops=True)"), std::string::npos) << message;
  }
  RegionProfile no_step = two_checkpoints_with_ops();
  no_step.step.reset();
  EXPECT_THROW(solve_peak_ops(no_step, 400), BudgetError);
}

TEST(OpPeak, StepOpsReadBackAsWrittenAndOpsOutOfOrderAreRefused) {
  const RegionProfile profile = two_checkpoints_with_ops();
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  ASSERT_EQ(read.step->checkpoints[0].regions[0].ops.size(), 2u);
  EXPECT_EQ(read.step->checkpoints[0].regions[0].ops[0].outputs, std::vector<std::uint32_t>{4});
  EXPECT_EQ(solve_peak_ops(read, 299).recompute_seconds, solve_peak_ops(profile, 299).recompute_seconds);
  RegionProfile unordered = profile;
  std::swap(unordered.step->checkpoints[0].regions[0].ops[0], unordered.step->checkpoints[0].regions[0].ops[1]);
  try {
    profile_from_json(profile_to_json(unordered), "edited.json");
    FAIL() << "ops out of order were read";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("$.step.checkpoints[0].regions[0].ops[1].index"), std::string::npos)
        << error.what();
  }
  RegionProfile dangling = profile;
  dangling.step->checkpoints[0].regions[0].ops[0].outputs = {9};
  EXPECT_THROW(profile_from_json(profile_to_json(dangling), "edited.json"), BudgetError);
}

// A random step (random_step.hpp) with forward segments, whose regions have up to 2 ops each unless
// they must be saved. An op's output is its region's output, its saved storage or a storage of its
// own (freed in the profiled forward).
RegionProfile random_op_step(std::mt19937_64& rng, std::size_t calls) {
  const auto add_ops = [&](StepRegion& region, RegionCost& cost, StepMemory& step) {
    fixtures::add_random_step_ops(rng, region, cost, step);
  };
  return fixtures::random_step(rng, {calls, 2, true}, add_ops);
}

// Every plan: each region saved, recomputed, or recomputed keeping any subset of its ops (with some
// bytes and seconds); the least seconds within `peak`, or -1 where none fits. `lowest`: the least peak.
double every_plan_best(const RegionProfile& profile, std::uint64_t peak, std::uint64_t& lowest) {
  const std::size_t n = profile.regions.size();
  std::vector<std::size_t> option(n, 0);  // 0: save, 1 + mask: recompute keeping the ops in mask
  double best = -1;
  lowest = UINT64_MAX;
  while (true) {
    std::vector<Choice> choices(n, Choice::save);
    KeptOps kept(n);
    double seconds = 0;
    bool possible = true;
    for (std::size_t r = 0; r < n; ++r) {
      const RegionCost& region = profile.regions[r];
      if (option[r] == 0) continue;
      possible = possible && region.must_save.empty();
      choices[r] = Choice::recompute;
      std::vector<OpCost> ops;
      for (std::size_t o = 0; o < region.ops.size(); ++o) {
        if (((option[r] - 1) >> o) & 1) {
          ops.push_back(region.ops[o]);
          kept[r].push_back(region.ops[o].index);
        }
      }
      seconds += keeping_seconds(region, ops);
    }
    if (possible) {
      const std::uint64_t predicted = predict_step_peak(profile, choices, kept);
      lowest = std::min(lowest, predicted);
      if (predicted <= peak && (best < 0 || seconds < best)) best = seconds;
    }
    std::size_t r = 0;
    for (; r < n; ++r) {
      if (++option[r] <= (std::size_t{1} << profile.regions[r].ops.size())) break;
      option[r] = 0;
    }
    if (r == n) return best;
  }
}

TEST(OpPeak, ThePlanIsTheBestOfEveryPlanOnSmallRandomSteps) {
  std::mt19937_64 rng(50);
  int planned = 0, keeping = 0, refused = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const RegionProfile profile = random_op_step(rng, 1 + rng() % 3);
    std::uint64_t lowest = 0;
    every_plan_best(profile, 0, lowest);
    EXPECT_EQ(least_step_peak(profile), lowest) << trial;  // kept ops never lower the least peak
    const std::uint64_t most = profile.step->peak_bytes + 800;
    const std::uint64_t peak = rng() % 8 == 0 ? lowest - 1 : lowest + rng() % (most - lowest + 1);
    const double best = every_plan_best(profile, peak, lowest);
    if (best < 0) {
      EXPECT_THROW(solve_peak_ops(profile, peak), BudgetError) << trial;
      ++refused;
      continue;
    }
    const Plan plan = solve_peak_ops(profile, peak);
    ASSERT_TRUE(plan.exact) << trial;
    EXPECT_NEAR(plan.recompute_seconds, best, 1e-12) << trial;
    EXPECT_LE(plan.peak_bytes, peak) << trial;
    for (const std::vector<OpCost>& kept : plan.kept_ops) keeping += kept.empty() ? 0 : 1;
    EXPECT_EQ(plan.peak_bytes, predict_step_peak(profile, choices_of(plan), kept_ops_of(plan))) << trial;
    ++planned;
  }
  EXPECT_GT(planned, 120);
  EXPECT_GT(refused, 5);
  EXPECT_GT(keeping, 5);  // the random steps do make keeping ops the best choice
}

TEST(OpPeak, AProfileWithTooManyPlansToWeighGetsAPlanWithinThePeakMarkedNotExact) {
  std::mt19937_64 rng(46);
  RegionProfile profile = random_op_step(rng, 12);
  for (RegionCost& region : profile.regions) region.must_save.clear();
  EXPECT_EQ(solve_peak_ops(profile, profile.step->peak_bytes + 100000).recompute_seconds, 0.0);
  const std::uint64_t least = least_step_peak(profile);
  for (const std::uint64_t peak : {least, least + (profile.step->peak_bytes - least) / 2}) {
    const Plan plan = solve_peak_ops(profile, peak);
    EXPECT_LE(plan.peak_bytes, peak);
    EXPECT_FALSE(plan.exact);
    EXPECT_EQ(plan.least_recompute_seconds, 0.0);
    // No worse than the plan by regions alone.
    EXPECT_LE(plan.recompute_seconds, solve_peak(profile, peak).recompute_seconds + 1e-12);
  }
}

// 440 calls of 1 to 45 regions (10,328 in all), 20 ops each: the step model costs what changes from
// one segment to the next, the plans by regions are the knapsack's without its proof, and the
// per-op plans are priced ones (one pass over the ops each). Here: 0.3 s for the least peak and
// 0.8-0.9 s a budget (Release); the bound below only catches a blow-up on a loaded machine.
TEST(OpPeak, PlansTenThousandRegionsOfTwentyOpsByPeakInAboutASecond) {
  std::mt19937_64 rng(10000);
  std::uniform_real_distribution<double> seconds(0.0, 1e-3);
  const auto add_twenty_ops = [&](StepRegion& region, RegionCost& cost, StepMemory& step) {
    cost.must_save.clear();
    for (std::uint32_t o = 0; o < 20; ++o) {
      std::uint32_t made = o == 0 ? region.kept[1] : o == 19 ? region.kept[0] : 0;
      if (made == 0) {
        made = static_cast<std::uint32_t>(step.storages.size());
        step.storages.push_back(64 + rng() % 256);
      }
      region.ops.push_back({o, {made}});
      const OpCost op{o, o % 4 == 0 ? "aten::mm" : "aten::mul", step.storages[made], seconds(rng)};
      cost.seconds += op.seconds;
      cost.ops.push_back(op);
    }
    cost.op_overhead_seconds = 1e-5;
  };
  const RegionProfile profile = fixtures::random_step(rng, {440, 45, true}, add_twenty_ops);
  ASSERT_GT(profile.regions.size(), 10000u);
  auto start = std::chrono::steady_clock::now();
  const std::uint64_t least = least_step_peak(profile);
  const double least_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu regions x 20 ops: the least peak in %.3f s\n", profile.regions.size(), least_seconds);
#ifdef NDEBUG
  EXPECT_LT(least_seconds, 3.0);
#endif
  for (const double share : {0.1, 0.5, 0.9}) {
    const std::uint64_t peak =
        least + static_cast<std::uint64_t>(share * static_cast<double>(profile.step->peak_bytes - least));
    start = std::chrono::steady_clock::now();
    const Plan plan = solve_peak_ops(profile, peak);
    const double solved = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%zu regions x 20 ops, %.0f%% of the peak range: planned in %.3f s\n", profile.regions.size(),
                100 * share, solved);
    EXPECT_LE(plan.peak_bytes, peak) << "share " << share;
    EXPECT_EQ(plan.peak_bytes, predict_step_peak(profile, choices_of(plan), kept_ops_of(plan))) << "share " << share;
    EXPECT_LE(plan.recompute_seconds, solve_peak(profile, peak).recompute_seconds) << "share " << share;
#ifdef NDEBUG
    EXPECT_LT(solved, 5.0) << "share " << share;
#endif
  }
}

}  // namespace
}  // namespace remat::budget
