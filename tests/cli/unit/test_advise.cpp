// remat-report advise on profiles whose seconds are huge: every number it prints is JSON, and a
// profile whose seconds add up past the largest double is bad input naming the region and the fix.
#include "cli_runner.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

namespace remat::report::testing {
namespace {

std::string huge_profile(double last_seconds) {
  return R"({"kind":"region_profile","schema_version":1,"base_bytes":100,"regions":[)"
         R"({"name":"layers.0::attn","saved_bytes":10,"seconds":1e308},)"
         R"({"name":"layers.0::mlp","saved_bytes":20,"seconds":0.5},)"
         R"({"name":"layers.1::attn","saved_bytes":10,"seconds":)" +
         nlohmann::json(last_seconds).dump() + "}]}";
}

TEST(Advise, AProfileOfHugeSecondsGivesPlansInJson) {
  TempDir dir;
  const std::string file = dir.write("huge.json", huge_profile(2.0));
  const CliResult plan = run({"advise", file, "--budget", "100B", "--json"});
  ASSERT_EQ(plan.code, 0) << plan.err;
  const nlohmann::json parsed = nlohmann::json::parse(plan.out);  // throws on inf or nan
  EXPECT_EQ(parsed["recompute_seconds"].get<double>(), 1e308);
  EXPECT_EQ(parsed["decisions"]["layers.0::attn"], "recompute");
  const CliResult saved = run({"advise", file, "--budget", "110B", "--json"});
  ASSERT_EQ(saved.code, 0) << saved.err;
  EXPECT_EQ(nlohmann::json::parse(saved.out)["recompute_seconds"].get<double>(), 2.5);
  const CliResult frontier = run({"advise", file, "--json", "--steps", "3"});
  ASSERT_EQ(frontier.code, 0) << frontier.err;
  const nlohmann::json points = nlohmann::json::parse(frontier.out)["frontier"];
  ASSERT_EQ(points.size(), 3u) << frontier.out;
  EXPECT_EQ(points[0]["recompute_seconds"].get<double>(), 1e308);
  EXPECT_EQ(points[1]["recompute_seconds"].get<double>(), 0.5);
  EXPECT_EQ(points[2]["recompute_seconds"].get<double>(), 0.0);
}

TEST(Advise, SecondsAddingUpPastTheLargestNumberAreBadInputNamingTheRegionAndTheFix) {
  TempDir dir;
  const std::string file = dir.write("huge.json", huge_profile(1e308));
  for (const auto& args : {std::vector<std::string>{"advise", file, "--budget", "100B", "--json"},
                           std::vector<std::string>{"advise", file, "--json"}}) {
    const CliResult r = run(args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("$.regions: the regions' seconds up to 'layers.1::attn' (region 2) add up to more than "
                         "1.7976931348623157e+308"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("divide every region's seconds by the same factor"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace remat::report::testing
