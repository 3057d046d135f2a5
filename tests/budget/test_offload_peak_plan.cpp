// Plans by step peak that offload: when the step model counts an offloaded region's bytes on the
// device (gone after its forward, back from the backward of the next call that offloads, as
// CpuOffload's prefetch of 1 brings them; on a GPU the last region packed lingers until the next
// pack), and the search against every plan of small random profiles.

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <gtest/gtest.h>

#include "random_step.hpp"
#include "two_checkpoints.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace remat::budget {
namespace {

// two_checkpoints.hpp's step on `device`, c0 offloading 10 bytes and c1 110.
RegionProfile two_checkpoints(const std::string& device = "cpu") {
  RegionProfile profile = fixtures::two_checkpoints();
  profile.device = device;
  profile.regions[0].offload_bytes = 10;
  profile.regions[1].offload_bytes = 110;
  profile.host_copy = HostCopy{1e12, 1e12, 1 << 20};
  return profile;
}

const std::vector<Choice> kSaved{Choice::save, Choice::save};

TEST(OffloadPeak, AnOffloadedRegionLeavesTheDeviceAfterItsForwardAndIsBackForItsBackward) {
  RegionProfile profile = two_checkpoints();
  // c0 offloaded: gone through forward and c1's backward (220 - 110 at the end of forward, 300 -
  // 110 in c1's backward), back in c0's own: out0 held there beside the 10 bytes copied back, as
  // much as c0 kept saved (200).
  EXPECT_EQ(predict_step_peak(profile, kSaved, {true, false}), 200u);
  profile.step->segments[2].peak_bytes = 110;  // c0's backward lower: c1's shows, 300 - 110
  EXPECT_EQ(predict_step_peak(profile, kSaved, {true, false}), 190u);
  EXPECT_EQ(predict_step_peak(profile, kSaved, {false, false}), 300u);
  // Saved and offloaded at once is no choice.
  EXPECT_THROW(predict_step_peak(profile, {Choice::recompute, Choice::save}, {true, false}), BudgetError);
}

TEST(OffloadPeak, APrefetchBringsTheCallBeforeBackInTheNextOffloadingCallsBackward) {
  RegionProfile profile = two_checkpoints();
  profile.regions[1].offload_bytes = 10;
  profile.step->checkpoints[1].regions[0].kept = {3};  // c1 keeps s1 alone
  profile.step->storages[2] = 0;
  profile.step->segments[2].peak_bytes = 150;  // c0's backward below c1's
  // c1 offloaded alone: s1 leaves and its copy comes back in c1's backward, 300 - 10 + 10.
  EXPECT_EQ(predict_step_peak(profile, kSaved, {false, true}), 300u);
  // Both offloaded: c1's first unpack brings back c0's copy too (prefetch 1): c1's backward less
  // what both keep (120) plus both copies (20). Without the prefetch it would be 190.
  EXPECT_EQ(predict_step_peak(profile, kSaved, {true, true}), 200u);
}

TEST(OffloadPeak, OnAGpuTheLastRegionPackedStaysUntilTheNextPack) {
  // On a GPU the copy to the host runs beside compute and the offloader lets the device tensor go
  // at its next pack: c0, the only region offloaded, stays through forward and c1's backward.
  EXPECT_EQ(predict_step_peak(two_checkpoints("cpu"), kSaved, {true, false}), 200u);
  EXPECT_EQ(predict_step_peak(two_checkpoints("cuda:0"), kSaved, {true, false}), 300u);
}

TEST(OffloadPeak, TensorsTheOffloaderLeavesOnTheDeviceStayCounted) {
  RegionProfile profile = two_checkpoints();
  profile.step->checkpoints[0].regions[0].offload_kept = {1};          // s0 is a slice: CpuOffload keeps it
  EXPECT_EQ(predict_step_peak(profile, kSaved, {true, false}), 210u);  // c0's backward is the peak
  profile.step->segments[2].peak_bytes = 110;                          // lower it: c1's backward shows
  EXPECT_EQ(predict_step_peak(profile, kSaved, {true, false}), 300u - 100u);
}

TEST(OffloadPeak, ThePlanOffloadsWhereThatIsTheCheapestWayUnderThePeakAndWithinTheHostBudget) {
  const RegionProfile profile = two_checkpoints();
  // 250 bytes: without offload, c0 recomputed (1 s); with a host budget of 10, c0 offloaded
  // (copies next to nothing), its peak in c0's backward as with c0 saved.
  EXPECT_EQ(solve_peak(profile, 250).recompute_seconds, 1.0);
  const Plan plan = solve_peak_offload(profile, 250, 10);
  EXPECT_TRUE(plan.exact);
  EXPECT_TRUE(plan.offloaded[0]);
  EXPECT_FALSE(plan.offloaded[1]);
  EXPECT_EQ(plan.peak_bytes, 200u);
  EXPECT_EQ(plan.host_bytes, 10u);
  EXPECT_LT(plan.recompute_seconds, 1e-9);
  // A host budget of 9 holds no offload: the plan without offload.
  const Plan none = solve_peak_offload(profile, 250, 9);
  EXPECT_FALSE(none.offloaded[0] || none.offloaded[1]);
  EXPECT_EQ(none.recompute_seconds, 1.0);
  EXPECT_EQ(none.peak_bytes, solve_peak(profile, 250).peak_bytes);
  // The dump reads back with its prediction and host figures.
  const Plan read = plan_from_json(plan_to_json(plan), "plan");
  EXPECT_EQ(read.peak_bytes, 200u);
  EXPECT_EQ(read.host_bytes, 10u);
  EXPECT_TRUE(read.offloaded[0]);
}

TEST(OffloadPeak, APeakBelowEveryPlanNamesTheLeastWithThatHostBudget) {
  const RegionProfile profile = two_checkpoints();
  const std::uint64_t least = least_step_peak_offload(profile, 10);
  EXPECT_LE(least, least_step_peak(profile));
  try {
    solve_peak_offload(profile, least - 1, 10);
    FAIL() << "a peak below every plan's was accepted";
  } catch (const BudgetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the least any plan reaches is " + std::to_string(least) + " B"), std::string::npos)
        << message;
    EXPECT_NE(message.find("with a host budget of 10 bytes"), std::string::npos) << message;
  }
  RegionProfile no_copy = two_checkpoints();
  no_copy.host_copy.reset();
  EXPECT_THROW(solve_peak_offload(no_copy, 300, 10), BudgetError);
  RegionProfile no_step = two_checkpoints();
  no_step.step.reset();
  EXPECT_THROW(solve_peak_offload(no_step, 300, 10), BudgetError);
}

// A random step (random_step.hpp) on `device` with a random copy bandwidth, whose regions offload
// some bytes (or none) and may keep their saved storage on the device when they do.
RegionProfile random_step_profile(std::mt19937_64& rng, std::size_t calls, const std::string& device) {
  const HostCopy copy{std::uniform_real_distribution<double>(50.0, 5000.0)(rng), 1000.0, 1 << 20};
  std::uniform_int_distribution<std::uint64_t> bytes(1, 400);
  const auto add_offload = [&](StepRegion& region, RegionCost& cost, StepMemory&) {
    if (rng() % 4 == 0) region.offload_kept = {region.kept[1]};
    cost.offload_bytes = rng() % 5 == 0 ? 0 : bytes(rng);
  };
  RegionProfile profile = fixtures::random_step(rng, {calls, 3, false}, add_offload);
  profile.device = device;
  profile.host_copy = copy;
  return profile;
}

// Every plan: the least time whose predicted peak is within `peak` and whose offloaded bytes are
// within `host`, or -1 where none is.
double every_plan_best(const RegionProfile& profile, std::uint64_t peak, std::uint64_t host) {
  const std::size_t n = profile.regions.size();
  std::size_t combinations = 1;
  for (std::size_t r = 0; r < n; ++r) combinations *= 3;
  double best = -1;
  for (std::size_t code = 0; code < combinations; ++code) {
    std::vector<Choice> choices(n, Choice::save);
    std::vector<bool> offloaded(n, false);
    double seconds = 0;
    std::uint64_t host_bytes = 0;
    bool possible = true;
    std::size_t rest = code;
    for (std::size_t r = 0; r < n; ++r, rest /= 3) {
      const RegionCost& region = profile.regions[r];
      if (rest % 3 == 1) {
        possible = possible && region.must_save.empty();
        choices[r] = Choice::recompute;
        seconds += region.seconds;
      } else if (rest % 3 == 2) {
        possible = possible && region.must_save.empty() && region.offload_bytes > 0;
        offloaded[r] = true;
        host_bytes += region.offload_bytes;
        seconds += offload_seconds(profile, region);
      }
    }
    if (!possible || host_bytes > host) continue;
    if (predict_step_peak(profile, choices, offloaded) > peak) continue;
    if (best < 0 || seconds < best) best = seconds;
  }
  return best;
}

TEST(OffloadPeak, TheSearchFindsTheBestOfEveryPlanOnSmallRandomSteps) {
  std::mt19937_64 rng(46);
  int planned = 0, offloading = 0, refused = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const RegionProfile profile = random_step_profile(rng, 1 + rng() % 3, trial % 4 == 0 ? "cuda:0" : "cpu");
    const std::uint64_t host = rng() % 3 == 0 ? 0 : rng() % 900;
    const std::uint64_t least = least_step_peak_offload(profile, host);
    const std::uint64_t most = profile.step->peak_bytes + 400;
    const std::uint64_t peak = rng() % 6 == 0 ? least - 1 : least + (most > least ? rng() % (most - least + 1) : 0);
    const double best = every_plan_best(profile, peak, host);
    if (best < 0) {
      EXPECT_THROW(solve_peak_offload(profile, peak, host), BudgetError) << trial;
      ++refused;
      continue;
    }
    const Plan plan = solve_peak_offload(profile, peak, host);
    ASSERT_TRUE(plan.exact) << trial;
    EXPECT_NEAR(plan.recompute_seconds, best, 1e-9 * (1 + best)) << trial;
    EXPECT_LE(plan.peak_bytes, peak) << trial;
    EXPECT_LE(plan.host_bytes, host) << trial;
    EXPECT_EQ(plan.peak_bytes, predict_step_peak(profile, choices_of(plan), plan.offloaded)) << trial;
    ++planned;
    for (const bool off : plan.offloaded) offloading += off ? 1 : 0;
  }
  EXPECT_GT(planned, 60);
  EXPECT_GT(refused, 3);
  EXPECT_GT(offloading, 20);  // the random profiles do make offload the best choice
}

TEST(OffloadPeak, AProfileTooLargeToSearchToTheEndIsMarkedNotExact) {
  std::mt19937_64 rng(7);
  RegionProfile profile = random_step_profile(rng, 12, "cpu");
  while (profile.regions.size() < 24) profile = random_step_profile(rng, 12, "cpu");
  for (RegionCost& region : profile.regions) region.must_save.clear();
  const std::uint64_t host = 1 << 20;
  const Plan plan = solve_peak_offload(profile, profile.step->peak_bytes, host);
  EXPECT_LE(plan.peak_bytes, profile.step->peak_bytes);
  EXPECT_EQ(plan.recompute_seconds, 0.0);  // everything saved fits: proved at once
  const std::uint64_t least = least_step_peak_offload(profile, host);
  const Plan tight = solve_peak_offload(profile, least + (profile.step->peak_bytes - least) / 3, host);
  EXPECT_LE(tight.peak_bytes, tight.peak_budget_bytes);
  EXPECT_LE(tight.host_bytes, host);
  // 3^24 plans: the walk stops at its limit, and says so.
  EXPECT_FALSE(tight.exact);
  EXPECT_EQ(tight.least_recompute_seconds, 0.0);
}

// The plans the other solvers make that the search could start from, within both budgets: the
// plan by step peak without offload and offload plans by kept bytes at budgets across the range.
double other_solvers_best(const RegionProfile& profile, std::uint64_t peak, std::uint64_t host) {
  double best = std::numeric_limits<double>::infinity();
  try {
    best = solve_peak(profile, peak).recompute_seconds;
  } catch (const BudgetError&) {  // none fits without offload
  }
  const std::uint64_t least = least_kept_bytes(profile), most = profile.all_saved_bytes();
  for (std::uint64_t step = 0; step <= 2; ++step) {
    const Plan plan = solve_offload(profile, least + (most - least) * step / 2, host);
    if (predict_step_peak(profile, choices_of(plan), plan.offloaded) <= peak) {
      best = std::min(best, plan.recompute_seconds);
    }
  }
  return best;
}

// 20 to 70 regions: too many to weigh every plan (3^n), so the search moves from the other solvers'
// plans (a region's option changed, or two regions' at once) before its walk.
RegionProfile large_random_step(std::mt19937_64& rng) {
  RegionProfile profile;
  do {
    profile = random_step_profile(rng, 10 + rng() % 25, rng() % 2 ? "cpu" : "cuda:0");
  } while (profile.regions.size() < 20);
  for (RegionCost& region : profile.regions) {
    if (rng() % 3 != 0) region.must_save.clear();
  }
  return profile;
}

TEST(OffloadPeak, OnLargeStepsThePlanBeatsEveryOtherSolversPlanAndFitsBothBudgets) {
  std::mt19937_64 rng(50);
  int planned = 0, faster = 0, much_faster = 0;  // than the best of the other solvers' plans
  for (int trial = 0; trial < 10; ++trial) {
    const RegionProfile profile = large_random_step(rng);
    std::uint64_t offloadable = 0;
    for (const RegionCost& region : profile.regions) offloadable += region.offload_bytes;
    const std::uint64_t host = offloadable * (1 + rng() % 3) / 4;
    const std::uint64_t least = least_step_peak_offload(profile, host);
    const std::uint64_t peak = least + (profile.step->peak_bytes - least) * (1 + rng() % 3) / 4;
    const Plan plan = solve_peak_offload(profile, peak, host);
    ++planned;
    EXPECT_LE(plan.peak_bytes, peak) << trial;
    EXPECT_LE(plan.host_bytes, host) << trial;
    EXPECT_EQ(plan.peak_bytes, predict_step_peak(profile, choices_of(plan), plan.offloaded)) << trial;
    const double others = other_solvers_best(profile, peak, host);
    EXPECT_LE(plan.recompute_seconds, others + 1e-9) << trial;
    if (plan.recompute_seconds < others - 1e-9) ++faster;
    if (plan.recompute_seconds < 0.9 * others) ++much_faster;
  }
  EXPECT_EQ(planned, 10);
  // The moves and the walk find plans no other solver makes: measured, 7 of the 10 faster than
  // all of them, 6 by more than 10%.
  EXPECT_GE(faster, 5);
  EXPECT_GE(much_faster, 4);
}

TEST(OffloadPeak, ThePeakTheLeastSearchNamesIsOneAPlanMeets) {
  std::mt19937_64 rng(51);
  for (int trial = 0; trial < 12; ++trial) {
    const RegionProfile profile = trial % 2 ? large_random_step(rng) : random_step_profile(rng, 1 + rng() % 4, "cpu");
    const std::uint64_t host = rng() % 4 == 0 ? 0 : rng() % 2000;
    const std::uint64_t least = least_step_peak_offload(profile, host);
    const Plan plan = solve_peak_offload(profile, least, host);
    EXPECT_EQ(plan.peak_bytes, least) << trial;
    EXPECT_LE(plan.host_bytes, host) << trial;
    // At most the least peak of every other solver's plan.
    const std::uint64_t low = least_kept_bytes(profile), high = profile.all_saved_bytes();
    for (std::uint64_t step = 0; step <= 2; ++step) {
      const Plan other = solve_offload(profile, low + (high - low) * step / 2, host);
      EXPECT_LE(least, predict_step_peak(profile, choices_of(other), other.offloaded)) << trial;
    }
  }
}

TEST(OffloadPeak, AStepOfManyStoragesAndFewRegionsIsStillSearchedToTheEnd) {
  // Storages no region keeps make each prediction dearer, not the plans more: a few regions' every
  // plan is still weighed, and the least peak is at most the one without offload.
  std::mt19937_64 rng(53);
  for (int trial = 0; trial < 12; ++trial) {
    RegionProfile profile = random_step_profile(rng, 2 + rng() % 2, "cpu");
    profile.step->storages.resize(profile.step->storages.size() + 200000, 1);
    if (!profile.step->freed_in.empty()) profile.step->freed_in.resize(profile.step->storages.size(), -1);
    for (const std::uint64_t host : {std::uint64_t{0}, std::uint64_t{300}}) {
      const std::uint64_t least = least_step_peak_offload(profile, host);
      EXPECT_LE(least, least_step_peak(profile)) << trial;
      const Plan plan = solve_peak_offload(profile, least, host);
      EXPECT_EQ(plan.peak_bytes, least) << trial;
      EXPECT_TRUE(plan.exact) << trial;
      EXPECT_THROW(solve_peak_offload(profile, least - 1, host), BudgetError) << trial;
    }
  }
}

TEST(OffloadPeak, OffloadBytesAddingUpPastSixtyFourBitsAreRefused) {
  RegionProfile profile = two_checkpoints();
  profile.regions[0].offload_bytes = UINT64_MAX / 2 + 1;
  profile.regions[1].offload_bytes = UINT64_MAX / 2 + 1;
  for (const auto& plan : {+[](const RegionProfile& p) { return solve_peak_offload(p, UINT64_MAX, UINT64_MAX); },
                           +[](const RegionProfile& p) { return solve_offload(p, UINT64_MAX, UINT64_MAX); }}) {
    try {
      plan(profile);
      ADD_FAILURE() << "planned";
    } catch (const BudgetError& error) {
      EXPECT_NE(std::string(error.what()).find("offload_bytes add up past 64 bits"), std::string::npos) << error.what();
    }
  }
  EXPECT_THROW(least_step_peak_offload(profile, 1), BudgetError);
  EXPECT_NO_THROW(solve_peak_offload(profile, UINT64_MAX, 0));  // nothing offloaded: nothing added up
}

}  // namespace
}  // namespace remat::budget
