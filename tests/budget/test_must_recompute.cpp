// Regions that must be recomputed (their checkpoint runs them again in recompute all the same: they
// change their input in place, or their output is changed in place after they return): every
// solver recomputes them, keeping none of their ops and offloading nothing of them, and the dumps
// carry the reason and refuse a plan that keeps one, an empty reason, or one given with must_save.

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/op_plan.hpp>
#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "two_checkpoints.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace remat::budget {
namespace {

constexpr const char* kChangesItsInput = "it changes its input 0 in place (an op such as ReLU(inplace=True))";

RegionProfile profile_with_pinned(std::mt19937_64& rng, std::size_t regions) {
  RegionProfile profile;
  profile.base_bytes = rng() % 200;
  profile.host_copy = HostCopy{1000.0, 1000.0, 1 << 20};
  for (std::size_t r = 0; r < regions; ++r) {
    RegionCost region{"layers." + std::to_string(r) + "::act", 1 + rng() % 500,
                      0.01 + static_cast<double>(rng() % 1000) / 1000.0, 1};
    region.ops.push_back({0, "aten::mm", 1 + rng() % 300, region.seconds / 2});
    region.offload_bytes = 1 + rng() % 500;
    if (rng() % 3 == 0) region.must_recompute = kChangesItsInput;
    profile.regions.push_back(region);
  }
  return profile;
}

void expect_pinned_recomputed(const RegionProfile& profile, const Plan& plan, const std::string& what) {
  ASSERT_EQ(plan.regions.size(), profile.regions.size());
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    if (profile.regions[r].must_recompute.empty()) continue;
    EXPECT_EQ(plan.regions[r].second, Choice::recompute) << what << ": " << profile.regions[r].name;
    if (!plan.kept_ops.empty()) {
      EXPECT_TRUE(plan.kept_ops[r].empty()) << what;
    }
    if (!plan.offloaded.empty()) {
      EXPECT_FALSE(plan.offloaded[r]) << what;
    }
  }
}

TEST(MustRecompute, EverySolverRecomputesThePinnedRegionsWhateverTheBudget) {
  std::mt19937_64 rng(46);
  int pinned = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const RegionProfile profile = profile_with_pinned(rng, 1 + rng() % 10);
    for (const RegionCost& region : profile.regions) pinned += region.must_recompute.empty() ? 0 : 1;
    const std::uint64_t budget = profile.all_saved_bytes();  // room to save every region
    EXPECT_EQ(least_kept_bytes(profile), profile.base_bytes);
    const Plan plan = solve(profile, budget);
    expect_pinned_recomputed(profile, plan, "solve");
    const Plan ops = solve_ops(profile, budget);
    expect_pinned_recomputed(profile, ops, "solve_ops");
    const Plan offload = solve_offload(profile, profile.base_bytes, 1 << 20);
    expect_pinned_recomputed(profile, offload, "solve_offload");
    for (const Plan& point : frontier(profile, 4)) expect_pinned_recomputed(profile, point, "frontier");
  }
  EXPECT_GT(pinned, 100);
}

TEST(MustRecompute, GroupingKeepsTheReasonOfAnyMember) {
  RegionProfile profile;
  profile.regions = {{"layers.0::act", 100, 1.0, 1}, {"layers.1::act", 100, 1.0, 1}};
  profile.regions[1].must_recompute = kChangesItsInput;
  const RegionProfile grouped_profile = grouped(profile);
  ASSERT_EQ(grouped_profile.regions.size(), 1u);
  EXPECT_EQ(grouped_profile.regions[0].must_recompute, std::string("layers.1::act: ") + kChangesItsInput);
  EXPECT_EQ(solve(grouped_profile, 200).regions[0].second, Choice::recompute);
}

TEST(MustRecompute, GroupingRefusesAPatternWhoseRegionsMustBeSavedAndRecomputedNamingBoth) {
  constexpr const char* kWritesOutside = "it writes in place into a tensor it did not make";
  RegionProfile profile;
  profile.regions = {{"layers.0::norm", 100, 1.0, 1},
                     {"layers.0::mlp", 100, 1.0, 1},
                     {"layers.1::norm", 100, 1.0, 1},
                     {"layers.2::norm", 100, 1.0, 1}};
  profile.regions[2].must_recompute = kChangesItsInput;
  EXPECT_EQ(grouped(profile).regions[0].must_recompute, std::string("layers.1::norm: ") + kChangesItsInput);
  profile.regions[3].must_save = kWritesOutside;
  try {
    (void)grouped(profile);
    FAIL() << "a pattern standing for regions that must be saved and must be recomputed was planned";
  } catch (const BudgetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(std::string("'layers.*::norm' stands for 'layers.2::norm', which must be saved (") +
                           kWritesOutside + "), and for 'layers.1::norm', which must be recomputed (" +
                           kChangesItsInput + ")"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("plan each region on its own (without group=True; remat-report advise without --group)"),
              std::string::npos)
        << message;
  }
  // Planned region by region, each keeps its own pin, and the plan reads back.
  const Plan plan = solve(profile, profile.all_saved_bytes());
  EXPECT_EQ(plan.regions[2].second, Choice::recompute);
  EXPECT_EQ(plan.regions[3].second, Choice::save);
  EXPECT_EQ(plan_from_json(plan_to_json(plan), "plan").regions.size(), 4u);
  // Pinned alike in every layer, the pattern plans as before.
  profile.regions[3].must_save.clear();
  profile.regions[3].must_recompute = kChangesItsInput;
  EXPECT_EQ(solve(grouped(profile), profile.all_saved_bytes()).regions[0].second, Choice::recompute);
}

// The step-peak tests' two checkpoints, with the host copy priced: every plan fits a peak of 300
// bytes and saving both recomputes nothing, but c1's region must be recomputed.
RegionProfile two_checkpoints_copied_at_1000() {
  RegionProfile profile = fixtures::two_checkpoints();
  profile.host_copy = HostCopy{1000.0, 1000.0, 1 << 20};
  return profile;
}

TEST(MustRecompute, PlansByPeakRecomputeThePinnedRegionAndPredictThatPeak) {
  RegionProfile profile = two_checkpoints_copied_at_1000();
  EXPECT_EQ(solve_peak(profile, 300).regions[1].second, Choice::save);
  profile.regions[1].must_recompute = kChangesItsInput;
  const Plan plan = solve_peak(profile, 300);
  EXPECT_EQ(plan.regions[0].second, Choice::save);
  EXPECT_EQ(plan.regions[1].second, Choice::recompute);
  EXPECT_EQ(plan.recompute_seconds, 2.0);
  EXPECT_EQ(plan.peak_bytes, predict_step_peak(profile, {Choice::save, Choice::recompute}));
  const Plan offload = solve_peak_offload(profile, 300, 1 << 20);
  EXPECT_EQ(offload.regions[1].second, Choice::recompute);
  EXPECT_TRUE(offload.offloaded.empty() || !offload.offloaded[1]);
}

TEST(MustRecompute, TheReasonReadsBackAndAPlanKeepingThePinnedRegionIsRefused) {
  RegionProfile profile;
  profile.base_bytes = 10;
  profile.regions = {{"c::act", 300, 1.0, 1}, {"c::mlp", 500, 2.0, 1}};
  profile.regions[0].must_recompute = kChangesItsInput;
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  EXPECT_EQ(read.regions[0].must_recompute, kChangesItsInput);
  EXPECT_TRUE(read.regions[1].must_recompute.empty());
  Plan plan = solve(read, 10000);
  EXPECT_EQ(plan_from_json(plan_to_json(plan), "plan").regions[0].first.must_recompute, kChangesItsInput);
  plan.regions[0].second = Choice::save;
  plan.kept_bytes += 300;
  plan.recompute_seconds -= 1.0;
  plan.least_recompute_seconds = plan.recompute_seconds;
  try {
    plan_from_json(plan_to_json(plan), "edited.json");
    FAIL() << "a plan saving a region that must be recomputed was read";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("keeps 'c::act', which must be recomputed (it changes its input 0"),
              std::string::npos)
        << error.what();
  }
}

std::string refusal_of(const std::string& text) {
  try {
    profile_from_json(text, "profile.json");
  } catch (const BudgetError& error) {
    return error.what();
  }
  return "";
}

TEST(MustRecompute, AnEmptyReasonOrOneGivenWithMustSaveIsRefusedNamingTheField) {
  RegionProfile profile;
  profile.regions = {{"c::act", 300, 1.0, 1}};
  profile.regions[0].must_recompute = "REASON";
  std::string text = profile_to_json(profile);
  const std::size_t at = text.find("REASON");
  ASSERT_NE(at, std::string::npos);
  const std::string empty = std::string(text).replace(at, 6, "");
  EXPECT_NE(refusal_of(empty).find("must_recompute: is empty; leave it out where the region may be saved"),
            std::string::npos)
      << refusal_of(empty);
  profile.regions[0].must_save = "it draws from a torch.Generator of its own (aten::randn)";
  EXPECT_NE(refusal_of(profile_to_json(profile)).find("is given with must_save: no plan can both save and recompute "
                                                      "'c::act'"),
            std::string::npos)
      << refusal_of(profile_to_json(profile));
}

}  // namespace
}  // namespace remat::budget
