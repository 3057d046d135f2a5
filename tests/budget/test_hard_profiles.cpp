// The budget solver on the profiles that are hard for a knapsack: seconds proportional to bytes (a
// subset sum, where no bound prunes anything), times with noise, unrelated to bytes, or bytes plus
// a constant, at 10,000 regions, within a second; its proofs against references that need no
// proof (exhaustive search, a table over bytes); and seconds too large to add up.

#include <remat/budget/plan.hpp>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace remat::budget {
namespace {

// Generous for a loaded two-core CI machine: plans take a fifth of this here.
constexpr double kSecondsPerBudget = 2.0;

RegionProfile profile_of(std::size_t regions,
                         const std::function<std::pair<std::uint64_t, double>(std::size_t)>& cost) {
  RegionProfile profile;
  profile.base_bytes = std::uint64_t{1} << 30;
  for (std::size_t r = 0; r < regions; ++r) {
    const auto [bytes, seconds] = cost(r);
    profile.regions.push_back({"layers." + std::to_string(r) + "::block", bytes, seconds, 1});
  }
  return profile;
}

std::uint64_t budget_at(const RegionProfile& profile, double share) {
  return profile.base_bytes +
         static_cast<std::uint64_t>(share * static_cast<double>(profile.all_saved_bytes() - profile.base_bytes));
}

struct Timed {
  Plan plan;
  double seconds;
};

Timed timed_solve(const RegionProfile& profile, std::uint64_t budget) {
  const auto start = std::chrono::steady_clock::now();
  Plan plan = solve(profile, budget);
  return {std::move(plan), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

// The plan's own figures are those of its decisions, and it fits.
void expect_consistent(const RegionProfile& profile, const Plan& plan) {
  std::uint64_t kept = profile.base_bytes;
  double recompute = 0;
  ASSERT_EQ(plan.regions.size(), profile.regions.size());
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    if (plan.regions[r].second == Choice::save)
      kept += profile.regions[r].saved_bytes;
    else
      recompute += profile.regions[r].seconds;
  }
  EXPECT_EQ(kept, plan.kept_bytes);
  EXPECT_LE(plan.kept_bytes, plan.budget_bytes);
  EXPECT_DOUBLE_EQ(recompute, plan.recompute_seconds);
  EXPECT_LE(plan.least_recompute_seconds, plan.recompute_seconds);
  if (plan.exact) {
    EXPECT_EQ(plan.least_recompute_seconds, plan.recompute_seconds);
  }
}

TEST(BudgetSolverAtScale, TenThousandRegionsWithSecondsProportionalToBytesAreProvedOptimalWithinASecond) {
  // Any byte count from 1 MiB to 256 MiB and a second per GB: every choice that fills the budget
  // exactly is optimal, and only such a choice proves itself.
  std::mt19937_64 rng(43);
  std::uniform_int_distribution<std::uint64_t> bytes(1 << 20, 256 << 20);
  const RegionProfile profile = profile_of(10000, [&](std::size_t) {
    const std::uint64_t b = bytes(rng);
    return std::make_pair(b, static_cast<double>(b) * 1e-9);
  });
  for (const double share : {0.1, 0.3, 0.5, 0.7, 0.9}) {
    const std::uint64_t budget = budget_at(profile, share);
    const Timed solved = timed_solve(profile, budget);
    std::printf("proportional, %.0f%% of the range: %.3f s, %s\n", share * 100, solved.seconds,
                solved.plan.exact ? "proved optimal" : "not proved");
    EXPECT_LT(solved.seconds, kSecondsPerBudget) << share;
    EXPECT_TRUE(solved.plan.exact) << share;
    EXPECT_EQ(solved.plan.kept_bytes, budget) << share;  // filled to the byte: nothing recomputes less
    expect_consistent(profile, solved.plan);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Plan> plans = frontier(profile, 8);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("proportional, frontier of 8 budgets: %.3f s\n", seconds);
  EXPECT_LT(seconds, 8 * kSecondsPerBudget);
  ASSERT_EQ(plans.size(), 8u);
  for (const Plan& plan : plans) EXPECT_TRUE(plan.exact) << plan.budget_bytes;
}

TEST(BudgetSolverAtScale, TenThousandRegionsOfAnyShapeTakeUnderASecondAndBoundWhatTheyMiss) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::uint64_t> any_bytes(1 << 20, 256 << 20);
  std::normal_distribution<double> noise(1.0, 0.03);
  std::uniform_real_distribution<double> unrelated(1e-4, 1e-2);
  const std::uint64_t kind_bytes[] = {64 << 20, 256 << 20, 24 << 20, 96 << 20};
  struct Shape {
    const char* name;
    std::function<std::pair<std::uint64_t, double>(std::size_t)> cost;
  };
  const std::vector<Shape> shapes = {
      {"proportional, four kinds",
       [&](std::size_t r) { return std::make_pair(kind_bytes[r % 4], static_cast<double>(kind_bytes[r % 4]) * 1e-9); }},
      {"proportional, 4 KiB pages",
       [&](std::size_t) {
         const std::uint64_t b = 4096 * (256 + rng() % 65280);
         return std::make_pair(b, static_cast<double>(b) * 1e-9);
       }},
      {"any bytes, 3% noise",
       [&](std::size_t) {
         const std::uint64_t b = any_bytes(rng);
         return std::make_pair(b, static_cast<double>(b) * 1e-9 * noise(rng));
       }},
      {"unrelated", [&](std::size_t) { return std::make_pair(any_bytes(rng), unrelated(rng)); }},
      {"proportional plus a constant",
       [&](std::size_t) {
         const std::uint64_t b = any_bytes(rng);
         return std::make_pair(b, static_cast<double>(b) * 1e-9 + 1e-3);
       }},
  };
  for (const Shape& shape : shapes) {
    const RegionProfile profile = profile_of(10000, shape.cost);
    for (const double share : {0.1, 0.5, 0.9}) {
      const Timed solved = timed_solve(profile, budget_at(profile, share));
      std::printf("%s, %.0f%%: %.3f s, %s, recompute %.6f s, no plan below %.6f s\n", shape.name, share * 100,
                  solved.seconds, solved.plan.exact ? "proved optimal" : "not proved", solved.plan.recompute_seconds,
                  solved.plan.least_recompute_seconds);
      EXPECT_LT(solved.seconds, kSecondsPerBudget) << shape.name << " " << share;
      expect_consistent(profile, solved.plan);
      // Unproved, the plan is still within a thousandth of what any plan could recompute.
      EXPECT_LE(solved.plan.recompute_seconds - solved.plan.least_recompute_seconds,
                1e-3 * solved.plan.recompute_seconds)
          << shape.name << " " << share;
    }
  }
}

// The least recompute time over all choices, by a table over bytes in units of `unit`.
double least_recompute_by_table(const RegionProfile& profile, std::uint64_t budget, std::uint64_t unit) {
  const std::size_t capacity = static_cast<std::size_t>((budget - profile.base_bytes) / unit);
  std::vector<double> most_saved(capacity + 1, 0.0);
  double all = 0;
  for (const RegionCost& region : profile.regions) {
    all += region.seconds;
    const std::size_t units = static_cast<std::size_t>(region.saved_bytes / unit);
    for (std::size_t c = capacity + 1; c-- > units;) {
      most_saved[c] = std::max(most_saved[c], most_saved[c - units] + region.seconds);
    }
  }
  return all - most_saved[capacity];
}

TEST(BudgetSolverAtScale, FiftyRegionsWhoseBytesSharePagesAreProvedOptimal) {
  // Proportional seconds: thousands of distinct sums of bytes, too many states to carry, where a
  // table over 4 KiB pages settles the optimum.
  std::mt19937_64 rng(50);
  for (int trial = 0; trial < 20; ++trial) {
    const RegionProfile profile = profile_of(50, [&](std::size_t) {
      const std::uint64_t b = 4096 * (1 + rng() % 1000);
      return std::make_pair(
          b, static_cast<double>(b) * 1e-9 * (trial % 2 == 0 ? 1.0 : 1.0 + 0.01 * static_cast<double>(rng() % 5)));
    });
    const std::uint64_t budget = budget_at(profile, 0.05 + 0.9 * static_cast<double>(rng() % 1000) / 1000);
    const Plan plan = solve(profile, budget);
    EXPECT_TRUE(plan.exact) << "trial " << trial;
    EXPECT_NEAR(plan.recompute_seconds, least_recompute_by_table(profile, budget, 4096), 1e-12) << "trial " << trial;
    expect_consistent(profile, plan);
  }
}

double least_recompute_by_exhaustive_search(const RegionProfile& profile, std::uint64_t budget) {
  const std::size_t n = profile.regions.size();
  double least = std::numeric_limits<double>::infinity();
  for (std::uint64_t mask = 0; mask < (std::uint64_t{1} << n); ++mask) {
    std::uint64_t kept = profile.base_bytes;
    double recompute = 0;
    for (std::size_t r = 0; r < n; ++r) {
      if ((mask >> r) & 1)
        kept += profile.regions[r].saved_bytes;
      else
        recompute += profile.regions[r].seconds;
    }
    if (kept <= budget) least = std::min(least, recompute);
  }
  return least;
}

TEST(BudgetSolverAtScale, ProofsAndBoundsHoldAgainstExhaustiveSearchWhenBytesShareNoDivisor) {
  // Bytes up to 2^30 with no common divisor: no table fits, so exchanges and the front search
  // decide, in every shape; what a plan claims must hold.
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t n = 10 + rng() % 9;
    const int shape = trial % 4;
    const RegionProfile profile = profile_of(n, [&](std::size_t) {
      const std::uint64_t b = 1 + rng() % (std::uint64_t{1} << 30);
      const double proportional = static_cast<double>(b) * 1e-9;
      const double seconds = shape == 0   ? proportional
                             : shape == 1 ? proportional * (0.97 + 0.06 * static_cast<double>(rng() % 1000) / 1000)
                             : shape == 2 ? static_cast<double>(1 + rng() % 1000) * 1e-3
                                          : proportional + 0.1;
      return std::make_pair(b, seconds);
    });
    const std::uint64_t budget = budget_at(profile, static_cast<double>(rng() % 1000) / 1000);
    const Plan plan = solve(profile, budget);
    const double least = least_recompute_by_exhaustive_search(profile, budget);
    expect_consistent(profile, plan);
    EXPECT_LE(plan.least_recompute_seconds, least + 1e-9) << "trial " << trial;
    if (plan.exact) {
      EXPECT_NEAR(plan.recompute_seconds, least, 1e-9) << "trial " << trial;
    }
  }
}

TEST(BudgetSolverAtScale, HugeSecondsPlanAndSecondsAddingUpPastTheLargestNumberAreRefusedNamingTheRegion) {
  RegionProfile profile;
  profile.base_bytes = 100;
  profile.regions = {{"layers.0::attn", 10, 1e308, 1}, {"layers.0::mlp", 20, 0.5, 1}, {"layers.1::attn", 10, 2.0, 1}};
  const Plan least = solve(profile, 100);
  EXPECT_EQ(least.recompute_seconds, 1e308);  // and 2.5, below what a double this large tells apart
  const Plan one_saved = solve(profile, 110);
  EXPECT_EQ(one_saved.regions[0].second, Choice::save);
  EXPECT_DOUBLE_EQ(one_saved.recompute_seconds, 2.5);
  const nlohmann::json written = nlohmann::json::parse(plan_to_json(least));  // throws on inf or nan
  EXPECT_EQ(written["recompute_seconds"].get<double>(), 1e308);
  EXPECT_EQ(written["regions"][0]["seconds"].get<double>(), 1e308);

  profile.regions[2].seconds = 1e308;
  try {
    solve(profile, 110);
    FAIL() << "expected BudgetError";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("the regions' seconds up to 'layers.1::attn' (region 2) add up to more "
                        "than 1.7976931348623157e+308"),
              std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("divide every region's seconds by the same factor"), std::string::npos)
        << error.what();
  }
  try {
    profile_from_json(profile_to_json(profile), "huge.json");
    FAIL() << "expected BudgetError";
  } catch (const BudgetError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("huge.json: $.regions: the regions' seconds up to 'layers.1::attn'", 0),
              0u)
        << error.what();
  }
}

TEST(BudgetSolverAtScale, TheFrontierRecomputesNoMoreAsTheBudgetGrowsWhereNoPlanIsProved) {
  // 2,000 regions of four kinds whose bytes all differ a little: too many to prove in the time.
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(1.0, 0.03);
  const std::uint64_t kind_bytes[] = {64 << 20, 256 << 20, 24 << 20, 96 << 20};
  const double kind_seconds[] = {0.004, 0.011, 0.0015, 0.002};
  const RegionProfile profile = profile_of(2000, [&](std::size_t r) {
    return std::make_pair(kind_bytes[r % 4] + rng() % 4096, kind_seconds[r % 4] * noise(rng));
  });
  const std::vector<Plan> plans = frontier(profile, 40);
  ASSERT_EQ(plans.size(), 40u);
  std::size_t unproved = 0;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    expect_consistent(profile, plans[i]);
    unproved += plans[i].exact ? 0 : 1;
    if (i > 0) {
      EXPECT_LE(plans[i].recompute_seconds, plans[i - 1].recompute_seconds) << plans[i].budget_bytes;
    }
  }
  EXPECT_GT(unproved, 0u);
}

TEST(BudgetSolverAtScale, ADumpOfSecondsThatAreNotFiniteIsRefusedRatherThanWritten) {
  RegionProfile profile;
  profile.regions = {{"layers.0::attn", 10, std::numeric_limits<double>::infinity(), 1}};
  try {
    static_cast<void>(profile_to_json(profile));
    FAIL() << "expected BudgetError";
  } catch (const BudgetError& error) {
    EXPECT_EQ(std::string(error.what()),
              "the seconds of region 'layers.0::attn' is infinite, which a JSON dump "
              "cannot hold; give finite seconds, 0 or more");
  }
  Plan plan;
  plan.recompute_seconds = std::numeric_limits<double>::quiet_NaN();
  try {
    static_cast<void>(plan_to_json(plan));
    FAIL() << "expected BudgetError";
  } catch (const BudgetError& error) {
    EXPECT_EQ(std::string(error.what()),
              "the plan's recompute_seconds is NaN, which a JSON dump cannot hold; give finite seconds, 0 or more");
  }
}

}  // namespace
}  // namespace remat::budget
