// Per-op plans (save, recompute, or recompute keeping some ops' outputs) against exhaustive search,
// their dumps, and what a profile or plan with per-op figures may not say.

#include <remat/budget/op_plan.hpp>
#include <remat/budget/plan.hpp>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace remat::budget {
namespace {

RegionProfile random_op_profile(std::mt19937_64& rng, std::size_t regions, std::size_t most_ops) {
  RegionProfile profile;
  profile.base_bytes = rng() % 300;
  std::uniform_int_distribution<std::uint64_t> bytes(1, 400);
  std::uniform_real_distribution<double> seconds(0.0, 1.0);
  for (std::size_t r = 0; r < regions; ++r) {
    RegionCost region{"layers." + std::to_string(r) + "::mlp", bytes(rng), 0, 1};
    const std::size_t n = rng() % (most_ops + 1);
    double ops_seconds = 0;
    for (std::size_t o = 0; o < n; ++o) {
      // Some ops share bytes or seconds, so ties are tried too.
      const OpCost op{static_cast<std::uint32_t>(2 * o + rng() % 2), o % 2 == 0 ? "aten::mm" : "aten::silu",
                      rng() % 4 == 0 ? 100 : bytes(rng), rng() % 5 == 0 ? 0.25 : seconds(rng)};
      ops_seconds += op.seconds;
      region.ops.push_back(op);
    }
    region.seconds = ops_seconds + seconds(rng);
    region.op_overhead_seconds = rng() % 3 == 0 ? 0 : 0.05 * seconds(rng);
    profile.regions.push_back(region);
  }
  return profile;
}

// The least recompute seconds over every choice of every region (save, or any subset of its ops
// kept while it recomputes) that fits the budget.
double exhaustive_best(const RegionProfile& profile, std::uint64_t budget) {
  double best = 1e300;
  std::vector<std::size_t> option(profile.regions.size(), 0);  // 0: save, 1 + mask: keep the ops in mask
  while (true) {
    std::uint64_t kept = profile.base_bytes;
    double seconds = 0;
    for (std::size_t r = 0; r < profile.regions.size(); ++r) {
      const RegionCost& region = profile.regions[r];
      if (option[r] == 0) {
        kept += region.saved_bytes;
        continue;
      }
      std::vector<OpCost> chosen;
      for (std::size_t o = 0; o < region.ops.size(); ++o) {
        if (((option[r] - 1) >> o) & 1) chosen.push_back(region.ops[o]);
      }
      for (const OpCost& op : chosen) kept += op.bytes;
      seconds += keeping_seconds(region, chosen);
    }
    if (kept <= budget && seconds < best) best = seconds;
    std::size_t r = 0;
    for (; r < option.size(); ++r) {
      if (++option[r] <= (std::size_t{1} << profile.regions[r].ops.size())) break;
      option[r] = 0;
    }
    if (r == option.size()) break;
  }
  return best;
}

TEST(OpPlan, MatchesExhaustiveSearchOnSmallProfiles) {
  std::mt19937_64 rng(50);
  for (int trial = 0; trial < 400; ++trial) {
    const RegionProfile profile = random_op_profile(rng, 1 + rng() % 4, 4);
    std::uint64_t most = profile.all_saved_bytes();
    for (const RegionCost& region : profile.regions) {
      for (const OpCost& op : region.ops) most += op.bytes;
    }
    const std::uint64_t budget = profile.base_bytes + rng() % (most - profile.base_bytes + 1);
    const Plan plan = solve_ops(profile, budget);
    ASSERT_TRUE(plan.exact) << "trial " << trial;
    EXPECT_LE(plan.kept_bytes, budget);
    EXPECT_NEAR(plan.recompute_seconds, exhaustive_best(profile, budget), 1e-9) << "trial " << trial;
    EXPECT_DOUBLE_EQ(plan.least_recompute_seconds, plan.recompute_seconds);
    // The totals are those of the decisions and the kept ops.
    std::uint64_t kept = profile.base_bytes;
    double seconds = 0;
    for (std::size_t r = 0; r < plan.regions.size(); ++r) {
      const std::vector<OpCost> none;
      const std::vector<OpCost>& ops = plan.kept_ops.empty() ? none : plan.kept_ops[r];
      if (plan.regions[r].second == Choice::save) {
        EXPECT_TRUE(ops.empty());
        kept += plan.regions[r].first.saved_bytes;
      } else {
        for (const OpCost& op : ops) kept += op.bytes;
        seconds += keeping_seconds(profile.regions[r], ops);
      }
    }
    EXPECT_EQ(plan.kept_bytes, kept);
    EXPECT_NEAR(plan.recompute_seconds, seconds, 1e-12);
  }
}

TEST(OpPlan, WithoutOpsMakesTheRegionPlan) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    RegionProfile profile = random_op_profile(rng, 1 + rng() % 10, 0);
    const std::uint64_t budget = profile.base_bytes + rng() % (profile.all_saved_bytes() - profile.base_bytes + 1);
    const Plan by_ops = solve_ops(profile, budget);
    const Plan by_regions = solve(profile, budget);
    EXPECT_TRUE(by_ops.kept_ops.empty());
    EXPECT_NEAR(by_ops.recompute_seconds, by_regions.recompute_seconds, 1e-9) << "trial " << trial;
  }
}

TEST(OpPlan, KeepsTheExpensiveOpOfARegionTooLargeToSave) {
  RegionProfile profile;
  profile.base_bytes = 10;
  RegionCost region{"layers.0::mlp", 1000, 3.0, 1};
  region.ops = {{0, "aten::mm", 100, 2.0}, {1, "aten::silu", 100, 0.2}, {3, "aten::mm", 100, 0.7}};
  region.op_overhead_seconds = 0.01;
  profile.regions.push_back(region);
  const Plan plan = solve_ops(profile, 10 + 200);
  ASSERT_EQ(plan.kept_ops.size(), 1u);
  ASSERT_EQ(plan.kept_ops[0].size(), 2u);
  EXPECT_EQ(plan.kept_ops[0][0].index, 0u);
  EXPECT_EQ(plan.kept_ops[0][1].index, 3u);
  EXPECT_EQ(plan.kept_bytes, 210u);
  EXPECT_NEAR(plan.recompute_seconds, 3.0 - 2.7 + 0.02, 1e-12);
  // With the budget for all of it, saving it is cheaper.
  const Plan all = solve_ops(profile, 10 + 1000);
  EXPECT_EQ(all.regions[0].second, Choice::save);
  EXPECT_TRUE(all.kept_ops.empty());
  // An overhead larger than what the ops spare: keeping none is cheaper.
  profile.regions[0].op_overhead_seconds = 2.0;
  EXPECT_TRUE(solve_ops(profile, 210).kept_ops.empty());
}

TEST(OpPlan, PlanDumpRoundTripsWithKeptOps) {
  std::mt19937_64 rng(3);
  const RegionProfile profile = random_op_profile(rng, 6, 5);
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  ASSERT_EQ(read.regions.size(), profile.regions.size());
  for (std::size_t r = 0; r < read.regions.size(); ++r) {
    ASSERT_EQ(read.regions[r].ops.size(), profile.regions[r].ops.size());
    // A region without ops has no overhead to pay: the dump writes it with its ops.
    EXPECT_DOUBLE_EQ(read.regions[r].op_overhead_seconds,
                     profile.regions[r].ops.empty() ? 0.0 : profile.regions[r].op_overhead_seconds);
    for (std::size_t o = 0; o < read.regions[r].ops.size(); ++o) {
      EXPECT_EQ(read.regions[r].ops[o].index, profile.regions[r].ops[o].index);
      EXPECT_EQ(read.regions[r].ops[o].op, profile.regions[r].ops[o].op);
    }
  }
  const Plan plan = solve_ops(read, read.base_bytes + 500);
  ASSERT_FALSE(plan.kept_ops.empty());
  const Plan back = plan_from_json(plan_to_json(plan), "plan");
  EXPECT_EQ(back.kept_bytes, plan.kept_bytes);
  ASSERT_EQ(back.kept_ops.size(), plan.kept_ops.size());
  for (std::size_t r = 0; r < plan.kept_ops.size(); ++r) EXPECT_EQ(back.kept_ops[r].size(), plan.kept_ops[r].size());
  EXPECT_EQ(plan_to_json(back), plan_to_json(plan));
}

TEST(OpPlan, RefusesDumpsThatContradictThemselves) {
  RegionProfile profile;
  RegionCost region{"c::r", 1000, 3.0, 1};
  region.ops = {{0, "aten::mm", 100, 2.0}, {2, "aten::mm", 100, 0.5}};
  region.op_overhead_seconds = 0.01;
  profile.regions.push_back(region);
  nlohmann::json doc = nlohmann::json::parse(profile_to_json(profile));
  doc["regions"][0]["ops"][1]["index"] = 0;
  EXPECT_THROW(
      {
        try {
          profile_from_json(doc.dump(), "p.json");
        } catch (const BudgetError& error) {
          EXPECT_NE(std::string(error.what()).find("$.regions[0].ops[1].index"), std::string::npos) << error.what();
          throw;
        }
      },
      BudgetError);
  doc = nlohmann::json::parse(profile_to_json(profile));
  doc["regions"][0]["ops"][1]["seconds"] = 5.0;  // more than the region's own
  EXPECT_THROW(profile_from_json(doc.dump(), "p.json"), BudgetError);

  const Plan plan = solve_ops(profile, 100);
  ASSERT_FALSE(plan.kept_ops.empty());
  nlohmann::json edited = nlohmann::json::parse(plan_to_json(plan));
  edited["kept_bytes"] = 0;
  EXPECT_THROW(plan_from_json(edited.dump(), "plan.json"), BudgetError);
  edited = nlohmann::json::parse(plan_to_json(plan));
  edited["decisions"]["c::r"] = "save";
  edited["regions"][0]["decision"] = "save";
  EXPECT_THROW(
      {
        try {
          plan_from_json(edited.dump(), "plan.json");
        } catch (const BudgetError& error) {
          EXPECT_NE(std::string(error.what()).find("only a recomputed region keeps ops"), std::string::npos)
              << error.what();
          throw;
        }
      },
      BudgetError);
}

TEST(OpPlan, RefusesGroupedProfilesWithOps) {
  std::mt19937_64 rng(5);
  RegionProfile profile = random_op_profile(rng, 3, 3);
  profile.regions[0].count = 2;
  profile.regions[0].ops = {{0, "aten::mm", 1, 0.0}};
  EXPECT_THROW(solve_ops(profile, profile.base_bytes + 100), BudgetError);
}

TEST(OpPlan, PlansTenThousandRegionsOfTwentyOpsInUnderASecond) {
  std::mt19937_64 rng(10000);
  std::normal_distribution<double> noise(1.0, 0.03);
  RegionProfile profile;
  profile.base_bytes = std::uint64_t{1} << 30;
  std::uint64_t most = profile.base_bytes;
  for (std::size_t r = 0; r < 10000; ++r) {
    RegionCost region{"layers." + std::to_string(r / 4) + "::r" + std::to_string(r % 4), 0, 0, 1};
    for (std::uint32_t o = 0; o < 20; ++o) {
      const bool matmul = o % 4 == 0;
      const OpCost op{o, matmul ? "aten::mm" : "aten::mul", std::uint64_t{4} << 20,
                      (matmul ? 2e-3 : 1e-4) * noise(rng)};
      region.ops.push_back(op);
      region.saved_bytes += op.bytes / 2;
      region.seconds += op.seconds;
      most += op.bytes;
    }
    region.seconds *= 1.05;
    region.op_overhead_seconds = 2e-5;
    profile.regions.push_back(region);
  }
  for (const double share : {0.1, 0.3, 0.6}) {
    const auto start = std::chrono::steady_clock::now();
    const Plan plan =
        solve_ops(profile, profile.base_bytes +
                               static_cast<std::uint64_t>(share * static_cast<double>(most - profile.base_bytes)));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LE(plan.kept_bytes, plan.budget_bytes);
    EXPECT_LE(plan.least_recompute_seconds, plan.recompute_seconds);
    EXPECT_GE(plan.least_recompute_seconds, plan.recompute_seconds * (1 - 1e-3)) << "share " << share;
#ifdef NDEBUG
    EXPECT_LT(seconds, 1.0) << "share " << share;
#endif
  }
}

}  // namespace
}  // namespace remat::budget
