// Offload plans (each region saved, recomputed or offloaded within a device and a host budget)
// against exhaustive search, the copy cost model on the CPU and on a GPU, and their dumps.

#include <remat/budget/offload_plan.hpp>
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

RegionProfile random_profile(std::mt19937_64& rng, std::size_t regions, const std::string& device) {
  RegionProfile profile;
  profile.device = device;
  profile.base_bytes = rng() % 300;
  // Copies of 0.2 to 2 bytes a second: a region of 1 to 400 bytes costs 0.5 to 4000 seconds each way,
  // against its 0 to 1 s, so cheap and dear offloads both come up.
  std::uniform_real_distribution<double> rate(200.0, 2000.0);
  profile.host_copy = HostCopy{rate(rng), rate(rng), 1 << 20};
  std::uniform_int_distribution<std::uint64_t> bytes(1, 400);
  std::uniform_real_distribution<double> seconds(0.0, 1.0);
  for (std::size_t r = 0; r < regions; ++r) {
    RegionCost region{"layers." + std::to_string(r) + "::mlp", rng() % 4 == 0 ? 100 : bytes(rng),
                      rng() % 5 == 0 ? 0.25 : seconds(rng), 1};
    region.offload_bytes = rng() % 6 == 0 ? 0 : rng() % 3 == 0 ? region.saved_bytes : bytes(rng);
    profile.regions.push_back(region);
  }
  return profile;
}

// The least step time over every choice of `choosers` choosers (regions, or groups of them),
// region r taking the choice of the chooser whose power of 3 is power_of[r]: save, recompute, or
// offload where each region of it has bytes to move; bytes added up, copies priced per region.
double exhaustive_best_by_power(const RegionProfile& profile, const std::vector<std::size_t>& power_of,
                                std::size_t choosers, std::uint64_t budget, std::uint64_t host_budget) {
  double best = 1e300;
  std::size_t combinations = 1;
  for (std::size_t c = 0; c < choosers; ++c) combinations *= 3;
  for (std::size_t code = 0; code < combinations; ++code) {
    std::uint64_t kept = profile.base_bytes, host = 0;
    double seconds = 0;
    bool possible = true;
    for (std::size_t r = 0; r < profile.regions.size(); ++r) {
      const RegionCost& region = profile.regions[r];
      switch (code / power_of[r] % 3) {
        case 0: kept += region.saved_bytes; break;
        case 1: seconds += region.seconds; break;
        default:
          if (region.offload_bytes == 0) possible = false;
          host += region.offload_bytes;
          seconds += offload_seconds(profile, region);
      }
    }
    if (possible && kept <= budget && host <= host_budget && seconds < best) best = seconds;
  }
  return best;
}

// The least step time over every choice of every region (save, recompute, offload where it has
// bytes to move) within both budgets.
double exhaustive_best(const RegionProfile& profile, std::uint64_t budget, std::uint64_t host_budget) {
  std::vector<std::size_t> power_of_region;  // each region its own choice: 3 to its index
  for (std::size_t r = 0, power = 1; r < profile.regions.size(); ++r, power *= 3) power_of_region.push_back(power);
  return exhaustive_best_by_power(profile, power_of_region, profile.regions.size(), budget, host_budget);
}

void expect_consistent(const RegionProfile& profile, const Plan& plan) {
  std::uint64_t kept = profile.base_bytes, host = 0;
  double seconds = 0, copies = 0;
  ASSERT_EQ(plan.offloaded.size(), plan.regions.size());
  for (std::size_t r = 0; r < plan.regions.size(); ++r) {
    const RegionCost& region = profile.regions[r];
    if (plan.offloaded[r]) {
      EXPECT_EQ(plan.regions[r].second, Choice::save);  // the runtime saves it; the offloader moves it
      EXPECT_GT(region.offload_bytes, 0U);
      host += region.offload_bytes;
      copies += offload_seconds(profile, region);
      EXPECT_DOUBLE_EQ(plan.regions[r].first.offload_seconds, offload_seconds(profile, region));
    } else if (plan.regions[r].second == Choice::save) {
      kept += region.saved_bytes;
    } else {
      seconds += region.seconds;
    }
  }
  EXPECT_EQ(plan.kept_bytes, kept);
  EXPECT_EQ(plan.host_bytes, host);
  EXPECT_NEAR(plan.offload_seconds, copies, 1e-9);
  EXPECT_NEAR(plan.recompute_seconds, seconds + copies, 1e-9);
}

TEST(OffloadPlan, MatchesExhaustiveSearchOnSmallProfiles) {
  std::mt19937_64 rng(51);
  int offloading = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const RegionProfile profile = random_profile(rng, 1 + rng() % 7, trial % 2 == 0 ? "cpu" : "cuda:0");
    const std::uint64_t budget = profile.base_bytes + rng() % (profile.all_saved_bytes() - profile.base_bytes + 1);
    std::uint64_t all_offload = 0;
    for (const RegionCost& region : profile.regions) all_offload += region.offload_bytes;
    const std::uint64_t host_budget = trial % 7 == 0 ? 0 : rng() % (all_offload + 2);
    const Plan plan = solve_offload(profile, budget, host_budget);
    ASSERT_TRUE(plan.exact) << "trial " << trial;
    EXPECT_LE(plan.kept_bytes, budget);
    EXPECT_LE(plan.host_bytes, host_budget);
    EXPECT_NEAR(plan.recompute_seconds, exhaustive_best(profile, budget, host_budget), 1e-9) << "trial " << trial;
    EXPECT_DOUBLE_EQ(plan.least_recompute_seconds, plan.recompute_seconds);
    expect_consistent(profile, plan);
    if (plan.host_bytes > 0) ++offloading;
  }
  EXPECT_GT(offloading, 60);  // the trials weigh offload, not only save and recompute
}

// A profile of `layers` layers of `kinds` regions each ("layers.L::rK"), figures drawn as
// random_profile draws them: grouped, each "layers.*::rK" stands for `layers` regions.
RegionProfile random_layered_profile(std::mt19937_64& rng, std::size_t layers, std::size_t kinds,
                                     const std::string& device) {
  RegionProfile drawn = random_profile(rng, layers * kinds, device);
  for (std::size_t r = 0; r < drawn.regions.size(); ++r) {
    drawn.regions[r].name =
        "layers." + std::to_string(r / kinds) + "::r" + std::string(1, static_cast<char>('a' + r % kinds));
  }
  return drawn;
}

// The least step time over every choice of every group (each region of a group takes the group's
// choice: save, recompute, or offload where each of its regions has bytes to move), weighed on the
// regions as measured: bytes added up, each region's copies priced on their own.
double exhaustive_grouped_best(const RegionProfile& profile, const RegionProfile& groups, std::uint64_t budget,
                               std::uint64_t host_budget) {
  std::vector<std::size_t> power_of_group;  // 3 to the group's index, for each region
  for (const RegionCost& region : profile.regions) {
    std::size_t power = 1;
    for (std::size_t g = 0; !matches(groups.regions[g].name, region.name); ++g) power *= 3;
    power_of_group.push_back(power);
  }
  return exhaustive_best_by_power(profile, power_of_group, groups.regions.size(), budget, host_budget);
}

// Grouped plans with offload: a pattern's choice, offload included, holds for every region it
// stands for; the plan's figures are those of the regions as measured, and no plan of choices by
// group is faster within both budgets. On a GPU each region's copies overlap its own forward
// alone, so a group's copies cost its regions' costs added up, not a cost priced from its sums.
TEST(OffloadPlan, GroupedPlansMatchExhaustiveSearchOverTheGroupsChoices) {
  std::mt19937_64 rng(53);
  int offloading = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const RegionProfile profile =
        random_layered_profile(rng, 1 + rng() % 4, 1 + rng() % 4, trial % 2 == 0 ? "cpu" : "cuda:0");
    const RegionProfile groups = grouped(profile);
    const std::uint64_t budget = profile.base_bytes + rng() % (profile.all_saved_bytes() - profile.base_bytes + 1);
    std::uint64_t all_offload = 0;
    for (const RegionCost& region : profile.regions) all_offload += region.offload_bytes;
    const std::uint64_t host_budget = trial % 7 == 0 ? 0 : rng() % (all_offload + 2);
    const Plan plan = solve_offload(groups, budget, host_budget);
    ASSERT_TRUE(plan.exact) << "trial " << trial;
    EXPECT_LE(plan.kept_bytes, budget);
    EXPECT_LE(plan.host_bytes, host_budget);
    EXPECT_NEAR(plan.recompute_seconds, exhaustive_grouped_best(profile, groups, budget, host_budget), 1e-9)
        << "trial " << trial;
    // The plan's figures, region by region.
    std::uint64_t kept = profile.base_bytes, host = 0;
    double seconds = 0;
    const RegionChoices choices(plan);
    for (const RegionCost& region : profile.regions) {
      if (choices.offloads(region.name)) {
        ASSERT_GT(region.offload_bytes, 0U) << "trial " << trial << ": offloads " << region.name;
        host += region.offload_bytes;
        seconds += offload_seconds(profile, region);
      } else if (choices.choice_for(region.name) == Choice::save) {
        kept += region.saved_bytes;
      } else {
        seconds += region.seconds;
      }
    }
    EXPECT_EQ(plan.kept_bytes, kept);
    EXPECT_EQ(plan.host_bytes, host);
    EXPECT_NEAR(plan.recompute_seconds, seconds, 1e-9);
    if (plan.host_bytes > 0) ++offloading;
  }
  EXPECT_GT(offloading, 40);
}

TEST(OffloadPlan, AGroupCostsItsRegionsCopiesAddedUpOnAGpu) {
  // Two regions of 1 s: one moves 2000 bytes (2 s each way at 1000 bytes/s, 1 s beyond its
  // forward each way), one 0 bytes' worth beyond (100 bytes: 0.1 s within its forward).
  RegionProfile profile;
  profile.device = "cuda:0";
  profile.host_copy = HostCopy{1000.0, 1000.0, 1 << 20};
  for (const std::uint64_t bytes : {2000U, 100U}) {
    RegionCost region{"layers." + std::to_string(profile.regions.size()) + "::mlp", bytes, 1.0, 1};
    region.offload_bytes = bytes;
    profile.regions.push_back(region);
  }
  const RegionProfile groups = grouped(profile);
  ASSERT_EQ(groups.regions.size(), 1U);
  EXPECT_EQ(groups.regions[0].offload_bytes, 2100U);
  // Priced from the sums (2.1 s each way against 2 s of forward) it would cost 0.2 s; it costs 2 s.
  EXPECT_DOUBLE_EQ(offload_seconds(groups, groups.regions[0]), 2.0);
  // A region with nothing to move makes its group one that cannot be offloaded.
  profile.regions[1].offload_bytes = 0;
  EXPECT_EQ(grouped(profile).regions[0].offload_bytes, 0U);
  EXPECT_EQ(solve_offload(grouped(profile), 0, 1 << 20).host_bytes, 0U);
  // By step peak, a host budget plans regions as measured.
  try {
    (void)solve_peak_offload(grouped(profile), 1 << 20, 1 << 20);
    ADD_FAILURE() << "accepted";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("region 'layers.*::mlp' stands for 2 regions (a grouped profile)"),
              std::string::npos)
        << error.what();
  }
}

TEST(OffloadPlan, HostBudgetZeroMakesTheRegionPlan) {
  std::mt19937_64 rng(52);
  for (int trial = 0; trial < 50; ++trial) {
    const RegionProfile profile = random_profile(rng, 12, "cpu");
    const std::uint64_t budget = profile.base_bytes + rng() % (profile.all_saved_bytes() - profile.base_bytes + 1);
    const Plan plan = solve_offload(profile, budget, 0);
    const Plan plain = solve(profile, budget);
    EXPECT_EQ(plan.host_bytes, 0U);
    EXPECT_EQ(plan.kept_bytes, plain.kept_bytes);
    EXPECT_NEAR(plan.recompute_seconds, plain.recompute_seconds, 1e-12);
    for (std::size_t r = 0; r < plan.regions.size(); ++r) EXPECT_FALSE(plan.offloaded[r]);
  }
}

TEST(OffloadPlan, CopiesOverlapComputeOnAGpuAndNotOnTheCpu) {
  RegionProfile profile;
  profile.host_copy = HostCopy{1000.0, 500.0, 1 << 20};
  RegionCost region{"layers.0::mlp", 400, 0.5, 1};
  region.offload_bytes = 400;  // 0.4 s to the host, 0.8 s back
  profile.device = "cpu";
  EXPECT_DOUBLE_EQ(offload_seconds(profile, region), 0.4 + 0.8);
  profile.device = "cuda:0";
  EXPECT_DOUBLE_EQ(offload_seconds(profile, region), 0.0 + 0.3);  // each copy beyond the region's 0.5 s
  region.seconds = 2;
  EXPECT_DOUBLE_EQ(offload_seconds(profile, region), 0.0);
  profile.host_copy.reset();
  EXPECT_THROW(offload_seconds(profile, region), BudgetError);
}

TEST(OffloadPlan, OffloadsWhereTheHostBudgetAndTheBandwidthMakeItCheapest) {
  // Two regions of 1000 bytes and 1 s each; the device holds one. Offloading the other costs
  // 2 x 1000 / bandwidth on the CPU.
  RegionProfile profile;
  profile.device = "cpu";
  for (int r = 0; r < 2; ++r) {
    RegionCost region{"layers." + std::to_string(r) + "::mlp", 1000, 1.0, 1};
    region.offload_bytes = 1000;
    profile.regions.push_back(region);
  }
  profile.host_copy = HostCopy{10000.0, 10000.0, 1 << 20};  // 0.2 s a region: cheaper than 1 s of recompute
  Plan plan = solve_offload(profile, 1000, 1000);
  EXPECT_EQ(plan.kept_bytes, 1000U);
  EXPECT_EQ(plan.host_bytes, 1000U);
  EXPECT_NEAR(plan.recompute_seconds, 0.2, 1e-12);
  // A host budget one byte short: recompute instead.
  plan = solve_offload(profile, 1000, 999);
  EXPECT_EQ(plan.host_bytes, 0U);
  EXPECT_NEAR(plan.recompute_seconds, 1.0, 1e-12);
  // Copies slower than recompute: recompute, whatever the host budget.
  profile.host_copy = HostCopy{1500.0, 1500.0, 1 << 20};  // 1.33 s
  plan = solve_offload(profile, 1000, 1 << 20);
  EXPECT_EQ(plan.host_bytes, 0U);
  EXPECT_NEAR(plan.recompute_seconds, 1.0, 1e-12);
  // The same copies on a GPU overlap the 1 s region: 0.33 s each way beyond it.
  profile.device = "cuda:0";
  plan = solve_offload(profile, 1000, 1 << 20);
  EXPECT_GE(plan.host_bytes, 1000U);
  EXPECT_NEAR(plan.recompute_seconds, 0.0, 1e-12);  // 0.67 s each way, within the region's 1 s
  // Everything offloaded where the device holds nothing beyond the inputs.
  profile.host_copy = HostCopy{1e9, 1e9, 1 << 20};
  plan = solve_offload(profile, 0, 2000);
  EXPECT_EQ(plan.host_bytes, 2000U);
  EXPECT_EQ(plan.kept_bytes, 0U);
}

// What the checkpoint runtime applies (CheckpointOptions::plan): a plan's choices with its offloaded
// regions, looked up as choices are (exact names first, then patterns), through a dump too.
TEST(OffloadPlan, RegionChoicesOfAPlanSayWhichRegionsItOffloads) {
  RegionProfile profile;
  profile.device = "cpu";
  for (int r = 0; r < 3; ++r) {
    RegionCost region{"layers." + std::to_string(r) + "::mlp", 1000, 1.0, 1};
    region.offload_bytes = 1000;
    profile.regions.push_back(region);
  }
  profile.host_copy = HostCopy{10000.0, 10000.0, 1 << 20};  // 0.2 s a region, against 1 s of recompute
  const Plan plan = plan_from_json(plan_to_json(solve_offload(profile, 1000, 1000)), "plan.json");
  ASSERT_EQ(plan.offloaded, (std::vector<bool>{false, true, false}));  // the dearest bytes last: 1 saved
  const RegionChoices choices(plan);
  EXPECT_TRUE(choices.offloads_any());
  EXPECT_EQ(choices.choice_for("layers.1::mlp"), Choice::save);  // an offloaded region runs saved
  EXPECT_TRUE(choices.offloads("layers.1::mlp"));
  EXPECT_FALSE(choices.offloads("layers.0::mlp"));
  EXPECT_FALSE(choices.offloads("layers.2::mlp"));
  EXPECT_FALSE(choices.offloads("layers.1::attn"));  // not in the plan
  EXPECT_FALSE(RegionChoices(solve(profile, 3000)).offloads_any());
  // Patterns: the entry a region takes its choice from decides; an exact name wins over a pattern.
  const RegionChoices patterns({{"layers.0::mlp", Choice::save}, {"layers.*::mlp", Choice::save}}, {"layers.*::mlp"});
  EXPECT_FALSE(patterns.offloads("layers.0::mlp"));
  EXPECT_TRUE(patterns.offloads("layers.7::mlp"));
}

TEST(OffloadPlan, RegionChoicesRefuseOffloadingARegionTheyRecomputeOrDoNotName) {
  const auto refused = [](const std::vector<std::string>& offloaded, const std::string& message) {
    try {
      RegionChoices({{"layers.0::mlp", Choice::recompute}, {"layers.1::mlp", Choice::save}}, offloaded);
      ADD_FAILURE() << "accepted";
    } catch (const BudgetError& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    }
  };
  refused({"layers.0::mlp"}, "the plan offloads 'layers.0::mlp', which it recomputes; an offloaded region runs saved");
  refused({"layers.2::mlp"}, "the plan offloads 'layers.2::mlp', which it makes no choice for");
  EXPECT_TRUE(RegionChoices({{"layers.1::mlp", Choice::save}}, {"layers.1::mlp"}).offloads("layers.1::mlp"));
}

TEST(OffloadPlan, RefusesAHostBudgetWithoutCopyFigures) {
  RegionProfile profile;
  profile.regions.push_back({"layers.0::mlp", 100, 1.0, 1});
  EXPECT_THROW(solve_offload(profile, 0, 100), BudgetError);
  EXPECT_EQ(solve_offload(profile, 100, 0).kept_bytes, 100U);  // no host budget: no figures needed
}

TEST(OffloadPlan, PlanAndProfileDumpsRoundTrip) {
  std::mt19937_64 rng(53);
  RegionProfile profile = random_profile(rng, 6, "cpu");
  profile.host_copy = HostCopy{1e6, 1e6, 1 << 20};
  const RegionProfile read = profile_from_json(profile_to_json(profile), "profile");
  ASSERT_TRUE(read.host_copy);
  EXPECT_DOUBLE_EQ(read.host_copy->to_host_bytes_per_second, 1e6);
  EXPECT_EQ(read.host_copy->measured_bytes, 1U << 20);
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    EXPECT_EQ(read.regions[r].offload_bytes, profile.regions[r].offload_bytes);
  }
  const Plan plan = solve_offload(read, read.base_bytes, 1 << 20);
  ASSERT_GT(plan.host_bytes, 0U);
  const std::string text = plan_to_json(plan);
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["host_budget_bytes"], 1 << 20);
  EXPECT_EQ(doc["host_bytes"], plan.host_bytes);
  int offloads = 0;
  for (const auto& [name, decision] : doc["decisions"].items()) offloads += decision == "offload";
  EXPECT_GT(offloads, 0);
  const Plan back = plan_from_json(text, "plan");
  EXPECT_EQ(back.offloaded, plan.offloaded);
  EXPECT_EQ(back.host_bytes, plan.host_bytes);
  EXPECT_EQ(plan_to_json(back), text);
}

TEST(OffloadPlan, RefusesPlanDumpsThatContradictThemselves) {
  RegionProfile profile;
  profile.device = "cpu";
  profile.host_copy = HostCopy{1e6, 1e6, 1 << 20};
  RegionCost region{"layers.0::mlp", 1000, 1.0, 1};
  region.offload_bytes = 1000;
  profile.regions.push_back(region);
  const std::string text = plan_to_json(solve_offload(profile, 0, 4096));
  const auto refused = [&](auto edit, const std::string& wanted) {
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text);
    edit(doc);
    try {
      plan_from_json(doc.dump(), "plan.json");
      ADD_FAILURE() << "accepted: " << wanted;
    } catch (const BudgetError& error) {
      EXPECT_NE(std::string(error.what()).find(wanted), std::string::npos) << error.what();
    }
  };
  refused([](auto& doc) { doc["host_bytes"] = 5000; }, "$.host_bytes");
  refused([](auto& doc) { doc["host_bytes"] = 10; }, "offload_bytes of the regions");
  refused([](auto& doc) { doc["host_budget_bytes"] = 999; }, "host budget");
  refused([](auto& doc) { doc["offload_seconds"] = 7.0; }, "$.offload_seconds");
  refused(
      [](auto& doc) {
        doc.erase("host_budget_bytes");
        doc.erase("host_bytes");
        doc.erase("offload_seconds");
      },
      "no host_budget_bytes");
  refused([](auto& doc) { doc["regions"][0]["decision"] = "save"; }, "contradicts itself");
  refused([](auto& doc) { doc["decisions"]["layers.0::mlp"] = "elsewhere"; }, "\"offload\"");
}

TEST(OffloadPlan, PlansTenThousandRegionsWithinBothBudgets) {
  std::mt19937_64 rng(54);
  RegionProfile profile;
  profile.device = "cpu";
  profile.host_copy = HostCopy{4e9, 4e9, 1 << 20};
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  const std::uint64_t sizes[4] = {8 << 20, 32 << 20, 4 << 20, 16 << 20};
  const double seconds[4] = {0.004, 0.02, 0.001, 0.006};
  for (std::size_t r = 0; r < 10000; ++r) {
    RegionCost region{"layers." + std::to_string(r / 4) + "::" + std::to_string(r % 4), sizes[r % 4] + rng() % 4096,
                      seconds[r % 4] * noise(rng), 1};
    region.offload_bytes = region.saved_bytes;
    profile.regions.push_back(region);
  }
  const std::uint64_t all = profile.all_saved_bytes();
  for (const std::uint64_t share : {10, 40, 70}) {
    const auto start = std::chrono::steady_clock::now();
    const Plan plan = solve_offload(profile, all * share / 100, all * (100 - share) / 300);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(took, 5.0);  // a fraction of a second here; loose for loaded CI machines
    EXPECT_LE(plan.kept_bytes, plan.budget_bytes);
    EXPECT_LE(plan.host_bytes, *plan.host_budget_bytes);
    // Only the 32 MiB regions spare more than their copies cost (16.8 ms for 20 ms): offloaded
    // where the device budget leaves some of them out.
    if (share < 53) {
      EXPECT_GT(plan.host_bytes, 0U) << "share " << share;
    }
    EXPECT_LE(plan.least_recompute_seconds, plan.recompute_seconds);
    // Within a small share of the bound whether proved or not.
    EXPECT_LE(plan.recompute_seconds - plan.least_recompute_seconds, 1e-3 * plan.recompute_seconds + 1e-9);
  }
}

}  // namespace
}  // namespace remat::budget
