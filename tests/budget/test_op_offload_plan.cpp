// Per-op plans with offload: each region saved, recomputed, recomputed keeping some of its ops, or
// offloaded, within a device budget and a host budget (by kept bytes, or by step peak), against
// every plan of small profiles; with a host budget of 0, or without ops, the other solvers' plans.

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/op_plan.hpp>
#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <gtest/gtest.h>

#include "random_step.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace remat::budget {
namespace {

// Copies of `slowest` to 10 times that many bytes a second each way.
HostCopy random_copy(std::mt19937_64& rng, double slowest) {
  std::uniform_real_distribution<double> rate(slowest, 10 * slowest);
  return HostCopy{rate(rng), rate(rng), 1 << 20};
}

// Adds up to 3 ops to `region` (each within the region's time) and draws its op overhead.
void add_random_ops(std::mt19937_64& rng, RegionCost& region) {
  std::uniform_int_distribution<std::uint64_t> bytes(1, 200);
  std::uniform_real_distribution<double> seconds(0.0, 0.3);
  const std::size_t ops = rng() % 4;
  for (std::uint32_t o = 0; o < ops; ++o) {
    const OpCost op{2 * o, o % 2 == 0 ? "aten::mm" : "aten::silu", bytes(rng), seconds(rng)};
    region.seconds += op.seconds;
    region.ops.push_back(op);
  }
  region.op_overhead_seconds = rng() % 3 == 0 ? 0 : 0.02 * seconds(rng);
}

RegionProfile random_profile(std::mt19937_64& rng, std::size_t regions) {
  RegionProfile profile;
  profile.device = rng() % 2 == 0 ? "cpu" : "cuda:0";
  profile.base_bytes = rng() % 300;
  // A region of 1 to 400 bytes costs 0.001 to 4 s to offload against its 0 to 1.9 s, so cheap and dear
  // offloads both come up.
  profile.host_copy = random_copy(rng, 200);
  std::uniform_int_distribution<std::uint64_t> bytes(1, 400);
  std::uniform_real_distribution<double> seconds(0.0, 1.0);
  for (std::size_t r = 0; r < regions; ++r) {
    RegionCost region{"layers." + std::to_string(r) + "::mlp", bytes(rng), seconds(rng), 1};
    region.offload_bytes = rng() % 6 == 0 ? 0 : rng() % 3 == 0 ? region.saved_bytes : bytes(rng);
    if (rng() % 12 == 0) region.must_save = "draws random numbers";
    if (region.must_save.empty()) add_random_ops(rng, region);
    profile.regions.push_back(region);
  }
  return profile;
}

// One way to run a region, as every-plan searches enumerate them.
struct Option {
  Choice choice = Choice::save;
  bool offload = false;
  std::vector<OpCost> kept;
};

// Save; recompute keeping each subset of the ops (none included); offload where it has bytes to move.
std::vector<Option> every_option(const RegionCost& region) {
  if (!region.must_save.empty()) return {Option{}};
  std::vector<Option> options{Option{}};
  for (std::size_t mask = 0; mask < (std::size_t{1} << region.ops.size()); ++mask) {
    Option keeping{Choice::recompute, false, {}};
    for (std::size_t o = 0; o < region.ops.size(); ++o) {
      if ((mask >> o) & 1) keeping.kept.push_back(region.ops[o]);
    }
    options.push_back(keeping);
  }
  if (region.offload_bytes > 0) options.push_back({Choice::save, true, {}});
  return options;
}

// Calls weigh(choices, offloaded, kept ops, seconds, host bytes) for every plan of the profile.
template <class Weigh>
void every_plan(const RegionProfile& profile, Weigh weigh) {
  std::vector<std::vector<Option>> options;
  for (const RegionCost& region : profile.regions) options.push_back(every_option(region));
  const std::size_t n = options.size();
  std::vector<std::size_t> at(n, 0);
  while (true) {
    std::vector<Choice> choices(n);
    std::vector<bool> offloaded(n);
    KeptOps kept(n);
    double seconds = 0;
    std::uint64_t host = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const Option& option = options[r][at[r]];
      const RegionCost& region = profile.regions[r];
      choices[r] = option.choice;
      offloaded[r] = option.offload;
      for (const OpCost& op : option.kept) kept[r].push_back(op.index);
      if (option.offload) {
        seconds += offload_seconds(profile, region);
        host += region.offload_bytes;
      } else if (option.choice == Choice::recompute) {
        seconds += keeping_seconds(region, option.kept);
      }
    }
    weigh(choices, offloaded, kept, seconds, host);
    std::size_t r = 0;
    for (; r < n && ++at[r] == options[r].size(); ++r) at[r] = 0;
    if (r == n) return;
  }
}

// What the checkpoints keep on the device with a plan's choices: inputs, saved regions that stay,
// kept ops.
std::uint64_t device_bytes(const RegionProfile& profile, const std::vector<Choice>& choices,
                           const std::vector<bool>& offloaded, const KeptOps& kept) {
  std::uint64_t bytes = profile.base_bytes;
  for (std::size_t r = 0; r < choices.size(); ++r) {
    const RegionCost& region = profile.regions[r];
    if (choices[r] == Choice::save && !offloaded[r]) bytes += region.saved_bytes;
    for (const std::uint32_t index : kept[r]) {
      bytes += std::find_if(region.ops.begin(), region.ops.end(), [&](const OpCost& op) {
                 return op.index == index;
               })->bytes;
    }
  }
  return bytes;
}

// The plan's figures, added up again from its decisions.
void expect_consistent(const RegionProfile& profile, const Plan& plan) {
  ASSERT_EQ(plan.offloaded.size(), profile.regions.size());
  const KeptOps kept = kept_ops_of(plan);
  EXPECT_EQ(plan.kept_bytes, device_bytes(profile, choices_of(plan), plan.offloaded, kept));
  std::uint64_t host = 0;
  double seconds = 0;
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    const RegionCost& region = profile.regions[r];
    if (plan.offloaded[r]) {
      EXPECT_EQ(plan.regions[r].second, Choice::save);
      EXPECT_TRUE(kept[r].empty());
      host += region.offload_bytes;
      seconds += offload_seconds(profile, region);
    } else if (plan.regions[r].second == Choice::recompute) {
      seconds += keeping_seconds(region, plan.kept_ops.empty() ? std::vector<OpCost>{} : plan.kept_ops[r]);
    }
  }
  EXPECT_EQ(plan.host_bytes, host);
  EXPECT_NEAR(plan.recompute_seconds, seconds, 1e-9);
}

TEST(OpOffloadPlan, MatchesEveryPlanOnSmallProfiles) {
  std::mt19937_64 rng(52);
  int exact = 0, both = 0;
  const int trials = 500;
  for (int trial = 0; trial < trials; ++trial) {
    const RegionProfile profile = random_profile(rng, 1 + rng() % 5);
    std::uint64_t most = profile.all_saved_bytes(), all_offload = 0;
    for (const RegionCost& region : profile.regions) {
      all_offload += region.offload_bytes;
      for (const OpCost& op : region.ops) most += op.bytes;
    }
    const std::uint64_t least = least_kept_bytes(profile);
    const std::uint64_t budget = least + rng() % (most - least + 1);
    const std::uint64_t host_budget = trial % 9 == 0 ? 0 : rng() % (all_offload + 2);
    double best = 1e300;
    every_plan(profile, [&](const std::vector<Choice>& choices, const std::vector<bool>& offloaded, const KeptOps& kept,
                            double seconds, std::uint64_t host) {
      if (host <= host_budget && device_bytes(profile, choices, offloaded, kept) <= budget) {
        best = std::min(best, seconds);
      }
    });
    const Plan plan = solve_ops_offload(profile, budget, host_budget);
    EXPECT_LE(plan.kept_bytes, budget) << trial;
    EXPECT_LE(plan.host_bytes, host_budget) << trial;
    EXPECT_EQ(plan.host_budget_bytes, host_budget) << trial;
    EXPECT_GE(plan.recompute_seconds, best - 1e-9) << trial;
    EXPECT_LE(plan.least_recompute_seconds, best + 1e-9) << trial;  // the bound holds where not proved
    if (plan.exact) {
      EXPECT_NEAR(plan.recompute_seconds, best, 1e-9) << trial;
      ++exact;
    }
    expect_consistent(profile, plan);
    const bool keeps =
        std::any_of(plan.kept_ops.begin(), plan.kept_ops.end(), [](const auto& k) { return !k.empty(); });
    if (keeps && plan.host_bytes > 0) ++both;
  }
  // Each proved: by the relaxation, or where it leaves a gap, by weighing every set of offloads.
  EXPECT_EQ(exact, trials);
  EXPECT_GT(both, 20);  // the trials make plans that keep ops and offload at once
}

TEST(OpOffloadPlan, AProfileWithManyOffloadsGetsAPlanWithinBothBudgetsNoSlowerThanEitherAlone) {
  std::mt19937_64 rng(56);
  int proved = 0;
  double gap = 0;  // the most a plan's time passes its bound, as a share of it
  for (int trial = 0; trial < 40; ++trial) {
    const RegionProfile profile = random_profile(rng, 40);  // about 33 offloadable: too many sets to weigh
    std::uint64_t all_offload = 0;
    for (const RegionCost& region : profile.regions) all_offload += region.offload_bytes;
    const std::uint64_t least = least_kept_bytes(profile);
    const std::uint64_t budget = least + rng() % (profile.all_saved_bytes() - least + 1);
    const std::uint64_t host_budget = rng() % (all_offload / 2 + 1);
    const Plan plan = solve_ops_offload(profile, budget, host_budget);
    EXPECT_LE(plan.kept_bytes, budget) << trial;
    EXPECT_LE(plan.host_bytes, host_budget) << trial;
    EXPECT_LE(plan.least_recompute_seconds, plan.recompute_seconds) << trial;
    EXPECT_LE(plan.recompute_seconds, solve_ops(profile, budget).recompute_seconds + 1e-9) << trial;
    EXPECT_LE(plan.recompute_seconds, solve_offload(profile, budget, host_budget).recompute_seconds + 1e-9) << trial;
    expect_consistent(profile, plan);
    proved += plan.exact ? 1 : 0;
    gap = std::max(gap, 1 - plan.least_recompute_seconds / plan.recompute_seconds);
  }
  std::printf("40 regions: %d of 40 plans proved; the others at most %.1f%% above their bound\n", proved, 100 * gap);
}

TEST(OpOffloadPlan, OnAnEightyRegionProfileAMoreHostBudgetNeverMeantASlowerPlan) {
  // The third of the random 80-region steps the weighing of several sets of offloads was measured on:
  // weighing only the best set met, host budgets of 9, 10 and 12 fortieths of the offloadable bytes
  // got plans up to 27% slower than at 8 fortieths.
  std::mt19937_64 rng(7);
  RegionProfile profile;
  std::uint64_t budget = 0;
  for (int trial = 0; trial < 3; ++trial) {
    profile = random_profile(rng, 80);
    const std::uint64_t least = least_kept_bytes(profile);
    budget = least + rng() % (profile.all_saved_bytes() - least + 1);
  }
  std::uint64_t all_offload = 0;
  for (const RegionCost& region : profile.regions) all_offload += region.offload_bytes;
  double fastest = std::numeric_limits<double>::infinity();
  for (std::uint64_t share = 0; share <= 20; ++share) {
    const Plan plan = solve_ops_offload(profile, budget, all_offload * share / 40);
    EXPECT_LE(plan.recompute_seconds, fastest + 1e-9) << share << " fortieths";
    fastest = std::min(fastest, plan.recompute_seconds);
  }
}

TEST(OpOffloadPlan, AHostBudgetOfZeroPlansAsSolveOpsAndAProfileWithoutOpsAsSolveOffload) {
  std::mt19937_64 rng(53);
  for (int trial = 0; trial < 200; ++trial) {
    RegionProfile profile = random_profile(rng, 1 + rng() % 8);
    const std::uint64_t least = least_kept_bytes(profile);
    const std::uint64_t budget = least + rng() % (profile.all_saved_bytes() - least + 1);
    const Plan zero = solve_ops_offload(profile, budget, 0);
    const Plan ops = solve_ops(profile, budget);
    EXPECT_EQ(zero.host_bytes, 0u);
    EXPECT_EQ(zero.exact, ops.exact) << trial;
    EXPECT_NEAR(zero.recompute_seconds, ops.recompute_seconds, 1e-12) << trial;
    EXPECT_EQ(zero.kept_bytes, ops.kept_bytes) << trial;
    for (RegionCost& region : profile.regions) region.ops.clear();
    const std::uint64_t host_budget = rng() % 800;
    const Plan plan = solve_ops_offload(profile, budget, host_budget);
    const Plan offload = solve_offload(profile, budget, host_budget);
    ASSERT_TRUE(offload.exact);
    if (plan.exact) {
      EXPECT_NEAR(plan.recompute_seconds, offload.recompute_seconds, 1e-9) << trial;
    }
    EXPECT_GE(plan.recompute_seconds, offload.recompute_seconds - 1e-9) << trial;
  }
}

// Four regions, one for each choice, on a CPU copying 1000 bytes a second each way (an offload of
// b bytes costs 2b/1000 s).
RegionProfile four_choices() {
  RegionProfile profile;
  profile.device = "cpu";
  profile.host_copy = HostCopy{1000.0, 1000.0, 1 << 20};
  RegionCost attn{"layers.0::attn", 100, 1.0, 1};
  attn.ops = {{0, "aten::mm", 20, 0.8}, {1, "aten::softmax", 60, 0.1}};
  attn.offload_bytes = 400;  // 0.8 s of copies: keeping the matmul (0.2 s left to recompute) is cheaper
  RegionCost mlp{"layers.0::mlp", 300, 2.0, 1};
  mlp.offload_bytes = 300;  // 0.6 s of copies against 2 s recomputed
  RegionCost norm{"layers.0::norm", 10, 0.5, 1};
  norm.offload_bytes = 10;
  RegionCost cheap{"layers.0::add", 200, 0.01, 1};
  cheap.offload_bytes = 200;
  profile.regions = {attn, mlp, norm, cheap};
  return profile;
}

TEST(OpOffloadPlan, EachRegionTakesTheCheapestOfItsFourChoicesWithinBothBudgets) {
  const RegionProfile profile = four_choices();
  // 30 device bytes hold the norm (10) and the matmul's output (20); 300 host bytes the MLP alone.
  const Plan plan = solve_ops_offload(profile, 30, 300);
  EXPECT_TRUE(plan.exact);
  EXPECT_EQ(plan.regions[0].second, Choice::recompute);
  ASSERT_EQ(plan.kept_ops.size(), 4u);
  ASSERT_EQ(plan.kept_ops[0].size(), 1u);
  EXPECT_EQ(plan.kept_ops[0][0].op, "aten::mm");
  EXPECT_EQ(plan.offloaded, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(plan.regions[2].second, Choice::save);
  EXPECT_EQ(plan.regions[3].second, Choice::recompute);
  EXPECT_EQ(plan.kept_bytes, 30u);
  EXPECT_EQ(plan.host_bytes, 300u);
  EXPECT_NEAR(plan.recompute_seconds, 0.2 + 0.6 + 0.01, 1e-12);
  EXPECT_NEAR(plan.offload_seconds, 0.6, 1e-12);
  // The dump reads back as written, and the runtime's choices carry out both the kept op and the offload.
  const Plan read = plan_from_json(plan_to_json(plan), "plan.json");
  EXPECT_EQ(read.offloaded, plan.offloaded);
  ASSERT_EQ(read.kept_ops.size(), 4u);
  EXPECT_EQ(read.kept_ops[0].size(), 1u);
  EXPECT_NEAR(read.recompute_seconds, plan.recompute_seconds, 1e-12);
  const RegionChoices choices(read);
  ASSERT_NE(choices.kept_ops_for("layers.0::attn"), nullptr);
  EXPECT_EQ(choices.kept_ops_for("layers.0::attn")->at(0), "aten::mm");
  EXPECT_TRUE(choices.offloads("layers.0::mlp"));
  EXPECT_FALSE(choices.offloads("layers.0::attn"));
  EXPECT_EQ(choices.choice_for("layers.0::norm"), Choice::save);
  // A host budget a byte short of the MLP's: it recomputes (the rest as before).
  const Plan small = solve_ops_offload(profile, 30, 299);
  EXPECT_TRUE(small.exact);
  EXPECT_EQ(small.regions[1].second, Choice::recompute);
  EXPECT_NEAR(small.recompute_seconds, 0.2 + 2.0 + 0.01, 1e-12);
  // A host budget on a profile without the copy bandwidth is refused; a host budget of 0 needs none.
  RegionProfile no_copy = profile;
  no_copy.host_copy.reset();
  EXPECT_THROW(solve_ops_offload(no_copy, 30, 300), BudgetError);
  EXPECT_NO_THROW(solve_ops_offload(no_copy, 30, 0));
}

TEST(OpOffloadPlan, AProfileWhoseOffloadBytesAddUpPast64BitsIsRefused) {
  RegionProfile profile = four_choices();
  for (RegionCost& region : profile.regions) region.offload_bytes = (std::uint64_t{1} << 63) + 1;
  try {
    profile_from_json(profile_to_json(profile), "edited.json");
    FAIL() << "offload bytes past 64 bits were read";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("offload_bytes add up past 64 bits"), std::string::npos) << error.what();
  }
}

// A random step (random_step.hpp) whose regions may keep up to 2 ops (their outputs: the region's
// output, its saved storage, or a storage of their own) and be offloaded (their kept storages).
RegionProfile random_op_offload_step(std::mt19937_64& rng, std::size_t calls) {
  const auto add = [&](StepRegion& region, RegionCost& cost, StepMemory& step) {
    if (rng() % 5 != 0) cost.offload_bytes = cost.saved_bytes;
    fixtures::add_random_step_ops(rng, region, cost, step);
  };
  RegionProfile profile = fixtures::random_step(rng, {calls, 2, true}, add);
  profile.device = rng() % 2 == 0 ? "cpu" : "cuda:0";
  profile.host_copy = random_copy(rng, 2000);  // a region keeps up to 800 bytes here
  return profile;
}

TEST(OpOffloadPlan, ByStepPeakThePlanIsTheBestOfEveryPlanOnSmallRandomSteps) {
  std::mt19937_64 rng(54);
  int planned = 0, refused = 0, keeping = 0, offloading = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const RegionProfile profile = random_op_offload_step(rng, 1 + rng() % 3);
    std::uint64_t all_offload = 0;
    for (const RegionCost& region : profile.regions) all_offload += region.offload_bytes;
    const std::uint64_t host_budget = trial % 7 == 0 ? 0 : rng() % (all_offload + 2);
    // Every plan's predicted peak, and the fastest within the host budget and a peak drawn across the range.
    std::vector<std::pair<std::uint64_t, double>> plans;  // (peak, seconds)
    every_plan(profile, [&](const std::vector<Choice>& choices, const std::vector<bool>& offloaded, const KeptOps& kept,
                            double seconds, std::uint64_t host) {
      if (host <= host_budget) plans.emplace_back(predict_step_peak(profile, choices, offloaded, kept), seconds);
    });
    std::uint64_t lowest = UINT64_MAX, highest = 0;
    for (const auto& [peak, seconds] : plans) {
      lowest = std::min(lowest, peak);
      highest = std::max(highest, peak);
    }
    const std::uint64_t peak_budget = rng() % 8 == 0 ? lowest - 1 : lowest + rng() % (highest - lowest + 1);
    double best = -1;
    for (const auto& [peak, seconds] : plans) {
      if (peak <= peak_budget && (best < 0 || seconds < best)) best = seconds;
    }
    if (best < 0) {
      EXPECT_THROW(solve_peak_ops_offload(profile, peak_budget, host_budget), BudgetError) << trial;
      ++refused;
      continue;
    }
    const Plan plan = solve_peak_ops_offload(profile, peak_budget, host_budget);
    ASSERT_TRUE(plan.exact) << trial;
    EXPECT_NEAR(plan.recompute_seconds, best, 1e-9) << trial;
    EXPECT_LE(plan.peak_bytes, peak_budget) << trial;
    EXPECT_LE(plan.host_bytes, host_budget) << trial;
    const KeptOps kept = kept_ops_of(plan);
    ASSERT_EQ(plan.offloaded.size(), profile.regions.size());
    EXPECT_EQ(plan.peak_bytes, predict_step_peak(profile, choices_of(plan), plan.offloaded, kept)) << trial;
    keeping += std::any_of(kept.begin(), kept.end(), [](const auto& k) { return !k.empty(); }) ? 1 : 0;
    offloading += plan.host_bytes > 0 ? 1 : 0;
    ++planned;
  }
  EXPECT_GT(planned, 100);
  EXPECT_GT(refused, 5);
  EXPECT_GT(keeping, 5);  // the random steps make both keeping ops and offloading the best choice
  EXPECT_GT(offloading, 5);
}

TEST(OpOffloadPlan, ByStepPeakBeyondEveryPlanTheFastestOfTheOtherSolversPlansMarkedNotExact) {
  std::mt19937_64 rng(55);
  RegionProfile profile = random_op_offload_step(rng, 12);
  for (RegionCost& region : profile.regions) region.must_save.clear();
  const std::uint64_t host_budget = profile.all_saved_bytes() / 3;
  const std::uint64_t least = least_step_peak(profile);  // without offload: every plan below weighs it
  for (const std::uint64_t peak : {least, least + (profile.step->peak_bytes - least) / 2}) {
    const Plan plan = solve_peak_ops_offload(profile, peak, host_budget);
    EXPECT_LE(plan.peak_bytes, peak);
    EXPECT_LE(plan.host_bytes, host_budget);
    EXPECT_FALSE(plan.exact);
    // No slower than the plan with offload by regions alone, nor the per-op plan without offload.
    EXPECT_LE(plan.recompute_seconds, solve_peak_offload(profile, peak, host_budget).recompute_seconds + 1e-12);
    EXPECT_LE(plan.recompute_seconds, solve_peak_ops(profile, peak).recompute_seconds + 1e-12);
  }
}

// 10,000 regions of 20 ops, a tenth of them offloadable at a price that makes offload worth it and
// a host budget that holds a third of those: the host price's bisection runs OpSolver's
// relaxation 40 times and its exact search once.
TEST(OpOffloadPlan, PlansTenThousandRegionsOfTwentyOpsWithAHostBudgetInAFewSeconds) {
  std::mt19937_64 rng(10001);
  RegionProfile profile;
  profile.device = "cpu";
  profile.host_copy = HostCopy{4e9, 4e9, 1 << 20};
  std::uniform_real_distribution<double> seconds(0.0, 1e-3);
  std::uint64_t offloadable = 0;
  for (std::size_t r = 0; r < 10000; ++r) {
    RegionCost region{"layers." + std::to_string(r / 4) + "::r" + std::to_string(r % 4), 0, 0, 1};
    for (std::uint32_t o = 0; o < 20; ++o) {
      const OpCost op{o, o % 4 == 0 ? "aten::mm" : "aten::mul", (64 + rng() % 256) << 10, seconds(rng)};
      region.saved_bytes += op.bytes / 2;
      region.seconds += op.seconds;
      region.ops.push_back(op);
    }
    region.op_overhead_seconds = 1e-5;
    if (r % 10 == 0) {
      region.offload_bytes = region.saved_bytes;
      offloadable += region.offload_bytes;
    }
    profile.regions.push_back(region);
  }
  for (const double share : {0.1, 0.5}) {
    const auto budget = static_cast<std::uint64_t>(share * static_cast<double>(profile.all_saved_bytes()));
    const auto start = std::chrono::steady_clock::now();
    const Plan plan = solve_ops_offload(profile, budget, offloadable / 3);
    const double solved = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("10,000 regions x 20 ops with offload, %.0f%% of the bytes: planned in %.3f s (%s)\n", 100 * share,
                solved, plan.exact ? "exact" : "not proved");
    EXPECT_LE(plan.kept_bytes, budget);
    EXPECT_LE(plan.host_bytes, offloadable / 3);
    EXPECT_GT(plan.host_bytes, offloadable / 4);  // the host budget binds, and is used
    EXPECT_LE(plan.recompute_seconds, solve_ops(profile, budget).recompute_seconds + 1e-12);
#ifdef NDEBUG
    EXPECT_LT(solved, 10.0) << "share " << share;
#endif
  }
}

}  // namespace
}  // namespace remat::budget
