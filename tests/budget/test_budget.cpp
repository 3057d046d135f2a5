// The budget solver against exhaustive search, its limits, grouping, pattern matching, and the
// region_profile and remat_plan dumps it reads and writes.

#include <remat/budget/plan.hpp>

#include "exhaustive_regions.hpp"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace remat::budget {
namespace {

using brute_force::exhaustive_best;

RegionProfile random_profile(std::mt19937_64& rng, std::size_t regions, std::uint64_t base) {
  RegionProfile profile;
  profile.base_bytes = base;
  std::uniform_int_distribution<std::uint64_t> bytes(1, 1000);
  std::uniform_real_distribution<double> seconds(0.0, 1.0);
  for (std::size_t r = 0; r < regions; ++r) {
    // Some regions cost the same bytes or the same time, so ties are tried too.
    const std::uint64_t b = rng() % 4 == 0 ? 100 : bytes(rng);
    const double s = rng() % 5 == 0 ? 0.25 : seconds(rng);
    profile.regions.push_back({"layers." + std::to_string(r) + "::attn", b, s, 1});
  }
  return profile;
}

TEST(BudgetSolver, MatchesExhaustiveSearchOnSmallProfiles) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng() % 14;
    const RegionProfile profile = random_profile(rng, n, rng() % 500);
    const std::uint64_t budget = profile.base_bytes + rng() % (profile.all_saved_bytes() - profile.base_bytes + 50);
    const Plan plan = solve(profile, budget);
    EXPECT_TRUE(plan.exact);
    EXPECT_LE(plan.kept_bytes, budget);
    EXPECT_NEAR(plan.recompute_seconds, exhaustive_best(profile, budget), 1e-9) << "trial " << trial;
    // The figures are those of the decisions.
    std::uint64_t kept = profile.base_bytes;
    double recompute = 0;
    ASSERT_EQ(plan.regions.size(), n);
    for (std::size_t r = 0; r < n; ++r) {
      EXPECT_EQ(plan.regions[r].first.name, profile.regions[r].name);
      if (plan.regions[r].second == Choice::save) kept += profile.regions[r].saved_bytes;
      else recompute += profile.regions[r].seconds;
    }
    EXPECT_EQ(kept, plan.kept_bytes);
    EXPECT_NEAR(recompute, plan.recompute_seconds, 1e-12);
  }
}

TEST(BudgetSolver, RecomputesNoMoreAsTheBudgetGrows) {
  std::mt19937_64 rng(5);
  const RegionProfile profile = random_profile(rng, 200, 4096);
  double previous = 1e300;
  for (std::uint64_t budget = profile.base_bytes; budget <= profile.all_saved_bytes(); budget += 997) {
    const Plan plan = solve(profile, budget);
    EXPECT_LE(plan.recompute_seconds, previous + 1e-9) << budget;
    previous = plan.recompute_seconds;
  }
  const Plan everything = solve(profile, profile.all_saved_bytes());
  EXPECT_EQ(everything.recompute_seconds, 0.0);
  EXPECT_EQ(everything.kept_bytes, profile.all_saved_bytes());
}

TEST(BudgetSolver, ABudgetBelowTheInputsNamesTheSmallestOne) {
  RegionProfile profile;
  profile.base_bytes = 3 << 20;
  profile.regions.push_back({"layers.0::attn", 1 << 20, 0.5, 1});
  try {
    solve(profile, (3 << 20) - 1);
    FAIL() << "expected BudgetError";
  } catch (const BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("the smallest budget a plan can meet is 3145728 bytes"),
              std::string::npos)
        << error.what();
  }
  const Plan least = solve(profile, 3 << 20);
  EXPECT_EQ(least.kept_bytes, 3u << 20);
  EXPECT_EQ(least.regions[0].second, Choice::recompute);
}

TEST(BudgetSolver, SavesWhatCostsNoBytesAndRecomputesWhatCostsNoTime) {
  RegionProfile profile;
  profile.regions = {{"c::free_bytes", 0, 0.3, 1}, {"c::free_time", 500, 0.0, 1}, {"c::big", 900, 1.0, 1}};
  const Plan plan = solve(profile, 100);
  EXPECT_EQ(plan.regions[0].second, Choice::save);
  EXPECT_EQ(plan.regions[1].second, Choice::recompute);
  EXPECT_EQ(plan.regions[2].second, Choice::recompute);  // does not fit
  EXPECT_EQ(plan.kept_bytes, 0u);
  EXPECT_DOUBLE_EQ(plan.recompute_seconds, 1.0);
}

TEST(BudgetSolver, TenThousandRegionsSolveExactlyInUnderASecond) {
  // Layers of four kinds of regions: the same shapes, so the same bytes, in every layer, and
  // times measured with a little noise, as a real profile has them.
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(1.0, 0.03);
  RegionProfile profile;
  profile.base_bytes = std::uint64_t{1} << 30;
  const std::uint64_t kind_bytes[] = {64 << 20, 256 << 20, 24 << 20, 96 << 20};
  const double kind_seconds[] = {0.004, 0.011, 0.0015, 0.002};
  for (int layer = 0; layer < 2500; ++layer) {
    for (int kind = 0; kind < 4; ++kind) {
      profile.regions.push_back({"layers." + std::to_string(layer) + "::r" + std::to_string(kind),
                                 kind_bytes[kind], kind_seconds[kind] * noise(rng), 1});
    }
  }
  const std::uint64_t budget = profile.base_bytes + (profile.all_saved_bytes() - profile.base_bytes) * 2 / 5;
  const auto start = std::chrono::steady_clock::now();
  const Plan plan = solve(profile, budget);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("10000 regions: solved in %.3f s, %s, kept %llu of %llu budget bytes\n", seconds,
              plan.exact ? "exact" : "not proved exact", static_cast<unsigned long long>(plan.kept_bytes),
              static_cast<unsigned long long>(budget));
  EXPECT_TRUE(plan.exact);
  EXPECT_LE(plan.kept_bytes, budget);
  EXPECT_LT(seconds, 5.0);  // the benchmark reports the time; this only catches a blow-up
}

TEST(BudgetSolver, AProfileTooLargeToSearchGivesAPlanWithinTheBudgetAndSaysHowCloseItIs) {
  // 2,000 regions whose bytes all differ a little: the front of the search outgrows its cap.
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(1.0, 0.03);
  RegionProfile profile;
  const std::uint64_t kind_bytes[] = {64 << 20, 256 << 20, 24 << 20, 96 << 20};
  const double kind_seconds[] = {0.004, 0.011, 0.0015, 0.002};
  for (int layer = 0; layer < 500; ++layer) {
    for (int kind = 0; kind < 4; ++kind) {
      profile.regions.push_back({"layers." + std::to_string(layer) + "::r" + std::to_string(kind),
                                 kind_bytes[kind] + rng() % 4096, kind_seconds[kind] * noise(rng), 1});
    }
  }
  const std::uint64_t budget = profile.all_saved_bytes() * 2 / 5;
  const auto start = std::chrono::steady_clock::now();
  const Plan plan = solve(profile, budget);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("2000 regions of varied bytes: %.3f s, %s, recompute %.6f s, no plan below %.6f s\n", seconds,
              plan.exact ? "exact" : "not proved exact", plan.recompute_seconds, plan.least_recompute_seconds);
  EXPECT_LE(plan.kept_bytes, budget);
  EXPECT_LE(plan.least_recompute_seconds, plan.recompute_seconds);
  EXPECT_LT(plan.recompute_seconds - plan.least_recompute_seconds, 1e-3 * plan.recompute_seconds);
  EXPECT_LT(seconds, 30.0);
}

TEST(BudgetGroups, RegionsDifferingInTheirNumbersBecomeOnePattern) {
  RegionProfile profile;
  profile.base_bytes = 10;
  profile.regions = {{"layers.0::attn", 100, 1.0, 1}, {"layers.0::mlp", 300, 0.5, 1},
                     {"layers.12::attn", 110, 1.5, 1}, {"layers.12::mlp", 290, 0.25, 1}};
  const RegionProfile groups = grouped(profile);
  ASSERT_EQ(groups.regions.size(), 2u);
  EXPECT_EQ(groups.regions[0].name, "layers.*::attn");
  EXPECT_EQ(groups.regions[0].saved_bytes, 210u);
  EXPECT_DOUBLE_EQ(groups.regions[0].seconds, 2.5);
  EXPECT_EQ(groups.regions[0].count, 2u);
  EXPECT_EQ(groups.regions[1].name, "layers.*::mlp");
  EXPECT_EQ(groups.base_bytes, 10u);
  const Plan plan = solve(groups, 10 + 210);
  EXPECT_EQ(plan.regions[0].second, Choice::save);
  EXPECT_EQ(plan.regions[1].second, Choice::recompute);
}

TEST(BudgetChoices, AStarStandsForANumberSoAGroupedPatternMatchesOnlyTheNamesItWasMadeFrom) {
  EXPECT_TRUE(matches("layers.*::attn", "layers.12::attn"));
  EXPECT_FALSE(matches("layers.*::attn", "layers.12::attn_out"));
  EXPECT_FALSE(matches("layers.*::attn", "layers.::attn"));
  EXPECT_TRUE(matches("layers.*::ff*", "layers.3::ff2"));
  EXPECT_FALSE(matches("layers.*::ff*", "layers.3::ff"));
  EXPECT_FALSE(matches("layers.*::mlp", "layers.3.sub::mlp"));
  EXPECT_FALSE(matches("*", "anything::at_all"));
  EXPECT_TRUE(matches("*", "2048"));
  EXPECT_TRUE(matches("layers.1*::attn", "layers.12::attn"));
  EXPECT_FALSE(matches("layers.1*::attn", "layers.1::attn"));  // '*' is at least one digit

  RegionProfile profile;
  profile.regions = {{"layers.0::ff2", 1, 1.0, 1},  {"layers.0::ff", 1, 1.0, 1},     {"layers.0::mlp", 1, 1.0, 1},
                     {"layers.0.sub::mlp", 1, 1.0, 1}, {"layers.1::ff2", 1, 1.0, 1}, {"layers.1::ff", 1, 1.0, 1},
                     {"layers.1::mlp", 1, 1.0, 1}, {"layers.1.sub::mlp", 1, 1.0, 1}};
  const RegionProfile groups = grouped(profile);
  const std::vector<std::string> patterns{"layers.*::ff*", "layers.*::ff", "layers.*::mlp", "layers.*.sub::mlp"};
  ASSERT_EQ(groups.regions.size(), patterns.size());
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    EXPECT_EQ(groups.regions[r % patterns.size()].name, patterns[r % patterns.size()]);
    std::vector<std::string> matched;
    for (const std::string& pattern : patterns) {
      if (matches(pattern, profile.regions[r].name)) matched.push_back(pattern);
    }
    // Its own pattern, no other: "layers.0::ff" is "layers.*::ff" only.
    EXPECT_EQ(matched, std::vector<std::string>{patterns[r % patterns.size()]}) << profile.regions[r].name;
  }
}

TEST(BudgetChoices, ExactNamesWinOverPatternsAndPatternsMatchInOrder) {
  const RegionChoices choices({{"layers.1*::attn", Choice::recompute},
                               {"layers.*::attn", Choice::save},
                               {"layers.3::attn", Choice::recompute}});
  EXPECT_EQ(choices.choice_for("layers.3::attn"), Choice::recompute);
  EXPECT_EQ(choices.choice_for("layers.12::attn"), Choice::recompute);
  EXPECT_EQ(choices.choice_for("layers.4::attn"), Choice::save);
  EXPECT_EQ(choices.choice_for("layers.4::mlp"), std::nullopt);
  EXPECT_EQ(RegionChoices({{"layers.0::attn", Choice::save}}).choice_for("layers.1::attn"), std::nullopt);
}

TEST(BudgetDumps, AProfileAndAPlanReadBackAsWritten) {
  RegionProfile profile;
  profile.base_bytes = 1234;
  profile.device = "cuda:1";
  profile.timer = "cuda_events";
  profile.regions = {{"layers.0::attn", 100, 0.125, 1}, {"layers.0::mlp", 300, 0.5, 1}};
  const std::string text = profile_to_json(profile);
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["kind"], "region-profile");
  EXPECT_EQ(doc["device"], 1);
  EXPECT_EQ(doc["all_saved_bytes"], 1634);
  const RegionProfile back = profile_from_json(text, "p.json");
  EXPECT_EQ(back.base_bytes, 1234u);
  EXPECT_EQ(back.regions.size(), 2u);
  EXPECT_EQ(back.regions[1].name, "layers.0::mlp");
  EXPECT_DOUBLE_EQ(back.regions[0].seconds, 0.125);

  const Plan plan = solve(back, 1234 + 300);
  const nlohmann::ordered_json written = nlohmann::ordered_json::parse(plan_to_json(plan));
  EXPECT_EQ(written["kind"], "remat-plan");
  EXPECT_EQ(written["decisions"]["layers.0::attn"], "recompute");
  EXPECT_EQ(written["decisions"]["layers.0::mlp"], "save");
  const Plan again = plan_from_json(plan_to_json(plan), "plan.json");
  EXPECT_EQ(again.kept_bytes, plan.kept_bytes);
  EXPECT_EQ(again.regions.size(), 2u);
  EXPECT_EQ(again.regions[1].second, Choice::save);
  EXPECT_EQ(again.regions[1].first.saved_bytes, 300u);
}

std::string refusal(const std::string& text, bool plan) {
  try {
    if (plan) plan_from_json(text, "edited.json");
    else profile_from_json(text, "edited.json");
  } catch (const BudgetError& error) {
    return error.what();
  }
  return "accepted";
}

TEST(BudgetDumps, AHandEditedDumpIsRefusedNamingTheField) {
  const std::string head = R"({"kind":"region_profile","schema_version":1,"base_bytes":)";
  EXPECT_EQ(refusal(head + R"(-5,"regions":[]})", false),
            "edited.json: $.base_bytes: must be a whole number of 0 or more, got -5");
  EXPECT_EQ(refusal(head + R"(0,"regions":[{"name":"a::b","saved_bytes":1,"seconds":"1"}]})", false),
            "edited.json: $.regions[0].seconds: must be a number of seconds, 0 or more, got \"1\"");
  EXPECT_EQ(refusal(head + R"(0,"regions":[{"name":"a::b","saved_bytes":1,"seconds":1},)"
                               R"({"name":"a::b","saved_bytes":2,"seconds":1}]})",
                    false),
            "edited.json: $.regions[1].name: 'a::b' is listed twice; each region appears once");
  EXPECT_EQ(refusal(head + R"(0,"base_bytes":1,"regions":[]})", false),
            "edited.json: $: the key 'base_bytes' is given twice in one object; keep one");
  // A number past a double's range fails in the JSON reader itself: refused there, at its path.
  EXPECT_EQ(refusal(head + R"(0,"regions":[{"name":"a::b","saved_bytes":1,"seconds":1},)"
                           R"({"name":"a::c","saved_bytes":1,"seconds":1e400}]})",
                    false)
                .rfind("edited.json: $.regions[1].seconds: is a number too large for a double (", 0),
            0u)
      << refusal(head + R"(0,"regions":[{"name":"a::b","saved_bytes":1,"seconds":1e400}]})", false);
  EXPECT_NE(refusal(head + R"(-1e400,"regions":[]})", false).find("edited.json: $.base_bytes: is a number too large"),
            std::string::npos);
  EXPECT_EQ(refusal(head + R"(0,"regions":[{"name":"a::b","name":"a::c","saved_bytes":1,"seconds":1}]})", false),
            "edited.json: $.regions[0]: the key 'name' is given twice in one object; keep one");
  EXPECT_EQ(refusal(R"({"kind":"region_profile","schema_version":2,"base_bytes":0,"regions":[]})", false),
            "edited.json: $.schema_version: is 2; this version reads schema_version 1");
  EXPECT_NE(refusal(R"({"kind":"region_profile","schema_version":1,"base_bytes":0,"regions":[]})", true)
                .find("this is a profile; make a plan from it"),
            std::string::npos);
  const std::string plan_head =
      R"({"kind":"remat_plan","schema_version":1,"budget_bytes":10,"base_bytes":0,"kept_bytes":0,)"
      R"("recompute_seconds":0,"decisions":)";
  EXPECT_EQ(refusal(plan_head + R"({"a::b":"keep"}})", true),
            "edited.json: $.decisions['a::b']: must be \"save\", \"recompute\" or \"offload\", got \"keep\"");
  EXPECT_EQ(refusal(plan_head + R"({"a::b":"save"}})", true), "accepted");
  EXPECT_EQ(refusal("{not json", false).rfind("edited.json: $: not JSON", 0), 0u);
}

TEST(BudgetDumps, KindsAreWrittenKebabCaseAndTheOldUnderscoredSpellingStillReads) {
  RegionProfile profile;
  profile.base_bytes = 10;
  profile.regions = {{"layers.0::attn", 100, 0.25, 1}};
  const std::string written = profile_to_json(profile);
  ASSERT_NE(written.find(R"("kind":"region-profile")"), std::string::npos);
  const std::string plan_written = plan_to_json(solve(profile, 110));
  ASSERT_NE(plan_written.find(R"("kind":"remat-plan")"), std::string::npos);
  auto respelled = [](std::string text, const std::string& from, const std::string& to) {
    return text.replace(text.find(from), from.size(), to);
  };
  // Dumps written before kinds were kebab-case read as the same profile and plan.
  const RegionProfile old_profile =
      profile_from_json(respelled(written, R"("region-profile")", R"("region_profile")"), "old.json");
  ASSERT_EQ(old_profile.regions.size(), 1u);
  EXPECT_EQ(old_profile.regions[0].saved_bytes, 100u);
  const Plan old_plan = plan_from_json(respelled(plan_written, R"("remat-plan")", R"("remat_plan")"), "old.json");
  ASSERT_EQ(old_plan.regions.size(), 1u);
  EXPECT_EQ(old_plan.regions[0].second, Choice::save);
  EXPECT_EQ(old_plan.kept_bytes, 110u);
  // A profile given as a plan, in either spelling, is told what to do with it; other kinds are
  // refused naming the kind as written now.
  for (const std::string profile_kind : {"region-profile", "region_profile"}) {
    const std::string text = respelled(written, R"("region-profile")", "\"" + profile_kind + "\"");
    EXPECT_EQ(refusal(text, true).rfind("edited.json: $.kind: is '" + profile_kind +
                                            "', not 'remat-plan': this is a profile; make a plan from it",
                                        0),
              0u);
  }
  const std::string profile_wanted =
      ": pass a region-profile dump, the profile remat.profile_regions() measures, written with "
      "profile.to_json() (remat-report summary FILE says what a dump is)";
  EXPECT_EQ(refusal(respelled(written, R"("region-profile")", R"("remat-plan")"), false),
            "edited.json: $.kind: is 'remat-plan', not 'region-profile'" + profile_wanted);
  EXPECT_EQ(refusal(respelled(written, R"("region-profile")", R"("region profile")"), false),
            "edited.json: $.kind: is 'region profile', not 'region-profile'" + profile_wanted);
}

TEST(BudgetDumps, APlanThatContradictsItselfIsRefusedNamingTheField) {
  RegionProfile profile;
  profile.base_bytes = 1000;
  profile.regions = {{"layers.0::attn", 100, 0.25, 1}, {"layers.0::mlp", 300, 0.5, 1}};
  const nlohmann::ordered_json plan = nlohmann::ordered_json::parse(plan_to_json(solve(profile, 1100)));
  ASSERT_EQ(plan["kept_bytes"], 1100);
  ASSERT_EQ(plan["decisions"]["layers.0::attn"], "save");
  EXPECT_EQ(refusal(plan.dump(), true), "accepted");
  auto edited = [&](const std::function<void(nlohmann::ordered_json&)>& edit) {
    nlohmann::ordered_json copy = plan;
    edit(copy);
    return refusal(copy.dump(), true);
  };
  const std::string again =
      "make the plan again (profile.plan(budget_bytes=...) or remat-report advise PROFILE --budget B --json) rather "
      "than editing its decisions";
  EXPECT_EQ(edited([](auto& p) { p["kept_bytes"] = 11000; }),
            "edited.json: $.kept_bytes: is 11000, more than budget_bytes (1100): the plan does not fit its own "
            "budget; " + again);
  EXPECT_EQ(edited([](auto& p) { p["base_bytes"] = 1101; }),
            "edited.json: $.base_bytes: is 1101, more than kept_bytes (1100), which includes it: " + again);
  EXPECT_EQ(edited([](auto& p) { p["regions"][1]["decision"] = "save"; }),
            "edited.json: $.regions[1].decision: is \"save\" but $.decisions['layers.0::mlp'] is \"recompute\"; the "
            "plan contradicts itself: " + again);
  // Every region saved, decisions and regions alike, the totals left as they were.
  EXPECT_EQ(edited([](auto& p) {
              p["budget_bytes"] = 2000;
              p["decisions"]["layers.0::mlp"] = "save";
              p["regions"][1]["decision"] = "save";
            }),
            "edited.json: $.kept_bytes: is 1100, but base_bytes and the saved_bytes of the regions it saves add up "
            "to 1400: the plan contradicts itself; " + again);
  EXPECT_EQ(edited([](auto& p) { p["recompute_seconds"] = 0.125; }),
            "edited.json: $.recompute_seconds: is 0.125, but the seconds of the regions it recomputes add up to 0.5: "
            "the plan contradicts itself; " + again);
  EXPECT_EQ(edited([](auto& p) { p["least_recompute_seconds"] = 0.75; }),
            "edited.json: $.least_recompute_seconds: is 0.75, more than recompute_seconds (0.5), which no plan can "
            "beat by recomputing more: " + again);
  EXPECT_EQ(edited([](auto& p) { p["regions"][0].erase("decision"); }),
            "edited.json: $.regions[0]: has no 'decision'");
}

TEST(BudgetDumps, APlanOfDecisionsAloneReadsBackWithoutCostsItNeverHad) {
  const std::string text =
      R"({"kind":"remat_plan","schema_version":1,"budget_bytes":100,"base_bytes":10,"kept_bytes":50,)"
      R"("recompute_seconds":0,"decisions":{"layers.*::attn":"save","layers.*::mlp":"recompute"}})";
  const Plan plan = plan_from_json(text, "hand.json");
  const std::string written = plan_to_json(plan);
  EXPECT_FALSE(nlohmann::json::parse(written).contains("regions"));
  const Plan again = plan_from_json(written, "written.json");
  EXPECT_EQ(again.kept_bytes, 50u);
  ASSERT_EQ(again.regions.size(), 2u);
  EXPECT_EQ(again.regions[0].first.name, "layers.*::attn");
  EXPECT_EQ(again.regions[1].second, Choice::recompute);
  EXPECT_EQ(refusal(R"({"kind":"remat_plan","schema_version":1,"budget_bytes":100,"base_bytes":10,"kept_bytes":500,)"
                    R"("recompute_seconds":0,"decisions":{}})",
                    true),
            "edited.json: $.kept_bytes: is 500, more than budget_bytes (100): the plan does not fit its own budget; "
            "make the plan again (profile.plan(budget_bytes=...) or remat-report advise PROFILE --budget B --json) "
            "rather than editing its decisions");
}

}  // namespace
}  // namespace remat::budget
