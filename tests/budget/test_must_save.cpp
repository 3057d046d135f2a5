// Regions that must be saved (their recompute would not give back what forward gave): every
// solver saves them, the least budget counts them, and the dumps carry the reason and refuse a
// plan that recomputes one.

#include <remat/budget/op_plan.hpp>
#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include "exhaustive_regions.hpp"
#include "two_checkpoints.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace remat::budget {
namespace {

RegionProfile profile_with_pinned(std::mt19937_64& rng, std::size_t regions) {
  RegionProfile profile;
  profile.base_bytes = rng() % 200;
  for (std::size_t r = 0; r < regions; ++r) {
    RegionCost region{"layers." + std::to_string(r) + "::mlp", 1 + rng() % 500, 0.01 + static_cast<double>(rng() % 1000) / 1000.0, 1};
    region.ops.push_back({0, "aten::mm", 1 + rng() % 300, region.seconds / 2});
    if (rng() % 3 == 0) region.must_save = "it draws from a torch.Generator of its own (aten::randn)";
    profile.regions.push_back(region);
  }
  return profile;
}

void expect_pinned_saved(const RegionProfile& profile, const Plan& plan, const std::string& what) {
  ASSERT_EQ(plan.regions.size(), profile.regions.size());
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    if (!profile.regions[r].must_save.empty()) {
      EXPECT_EQ(plan.regions[r].second, Choice::save) << what << ": " << profile.regions[r].name;
      if (!plan.kept_ops.empty()) {
        EXPECT_TRUE(plan.kept_ops[r].empty()) << what;
      }
    }
  }
}

TEST(MustSave, EverySolverSavesThePinnedRegionsAndTheRegionSolverStaysExact) {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 200; ++trial) {
    const RegionProfile profile = profile_with_pinned(rng, 1 + rng() % 10);
    const std::uint64_t least = least_kept_bytes(profile);
    const std::uint64_t budget = least + rng() % (profile.all_saved_bytes() - least + 1);
    const Plan plan = solve(profile, budget);
    expect_pinned_saved(profile, plan, "solve");
    EXPECT_LE(plan.kept_bytes, budget);
    EXPECT_NEAR(plan.recompute_seconds, brute_force::exhaustive_best(profile, budget), 1e-9) << "trial " << trial;
    const Plan ops = solve_ops(profile, budget);
    expect_pinned_saved(profile, ops, "solve_ops");
    EXPECT_LE(ops.kept_bytes, budget);
    EXPECT_LE(ops.recompute_seconds, plan.recompute_seconds + 1e-9);
    for (const Plan& point : frontier(profile, 4)) expect_pinned_saved(profile, point, "frontier");
  }
}

TEST(MustSave, TheLeastBudgetCountsThePinnedRegionsAndTheErrorNamesThem) {
  RegionProfile profile;
  profile.base_bytes = 1000;
  profile.regions = {{"c::noise", 300, 1.0, 1}, {"c::mlp", 500, 2.0, 1}};
  profile.regions[0].must_save = "it draws from a torch.Generator of its own (aten::randn)";
  EXPECT_EQ(least_kept_bytes(profile), 1300u);
  EXPECT_EQ(frontier(profile, 2).front().kept_bytes, 1300u);
  try {
    solve(profile, 1299);
    FAIL() << "a budget below the pinned regions' bytes was accepted";
  } catch (const BudgetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the regions that must be saved ('c::noise')"), std::string::npos) << message;
    EXPECT_NE(message.find("the smallest budget a plan can meet is 1300 bytes"), std::string::npos) << message;
  }
  const Plan least = solve(profile, 1300);
  EXPECT_EQ(least.regions[0].second, Choice::save);
  EXPECT_EQ(least.regions[1].second, Choice::recompute);
  EXPECT_EQ(least.kept_bytes, 1300u);
}

TEST(MustSave, GroupingKeepsTheReasonOfAnyMember) {
  RegionProfile profile;
  profile.regions = {{"layers.0::bn", 100, 1.0, 1}, {"layers.1::bn", 100, 1.0, 1}};
  profile.regions[1].must_save = "it writes in place into a tensor it did not make";
  const RegionProfile grouped_profile = grouped(profile);
  ASSERT_EQ(grouped_profile.regions.size(), 1u);
  EXPECT_EQ(grouped_profile.regions[0].must_save, "layers.1::bn: it writes in place into a tensor it did not make");
  EXPECT_EQ(solve(grouped_profile, 200).regions[0].second, Choice::save);
}

TEST(MustSave, APlanByPeakSavesThePinnedRegion) {
  // The step-peak tests' two checkpoints: recomputing c0 alone peaks least, but c0 must be saved.
  RegionProfile profile = fixtures::two_checkpoints();
  EXPECT_EQ(least_step_peak(profile), 200u);
  profile.regions[0].must_save = "it writes in place into a tensor it did not make";
  EXPECT_EQ(least_step_peak(profile), 300u);
  const Plan plan = solve_peak(profile, 300);
  EXPECT_EQ(plan.regions[0].second, Choice::save);
  EXPECT_THROW(solve_peak(profile, 299), BudgetError);
}

TEST(MustSave, TheReasonReadsBackAndAPlanRecomputingAPinnedRegionIsRefused) {
  RegionProfile profile;
  profile.base_bytes = 10;
  profile.regions = {{"c::noise", 300, 1.0, 1}, {"c::mlp", 500, 2.0, 1}};
  profile.regions[0].must_save = "it draws from a torch.Generator of its own (aten::randn)";
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  EXPECT_EQ(read.regions[0].must_save, profile.regions[0].must_save);
  EXPECT_TRUE(read.regions[1].must_save.empty());
  Plan plan = solve(read, 10000);
  EXPECT_EQ(plan_from_json(plan_to_json(plan), "plan").regions[0].first.must_save, profile.regions[0].must_save);
  plan.regions[0].second = Choice::recompute;
  plan.kept_bytes -= 300;
  plan.recompute_seconds += 1.0;
  plan.least_recompute_seconds = plan.recompute_seconds;
  try {
    plan_from_json(plan_to_json(plan), "edited.json");
    FAIL() << "a plan recomputing a region that must be saved was read";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("recomputes 'c::noise', which must be saved"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace remat::budget
