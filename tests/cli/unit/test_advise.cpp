// remat-report advise on profiles whose seconds are huge: every number it prints is JSON, and a
// profile whose seconds add up past the largest double is bad input naming the region and the fix.
#include "cli_runner.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

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

// Region counts that add up past 2^64 - 1 (each 2^63 is within 64 bits alone) are bad input naming
// the count that takes the sum past, as saved_bytes are: never a "saved regions" figure wrapped to 0.
TEST(Advise, RegionCountsAddingUpPast64BitsAreBadInputNamingTheCount) {
  TempDir dir;
  const std::string file = dir.write(
      "counts.json",
      R"({"kind":"region_profile","schema_version":1,"base_bytes":100,"regions":[)"
      R"({"name":"a","saved_bytes":10,"seconds":1,"count":9223372036854775808},)"
      R"({"name":"b","saved_bytes":10,"seconds":1,"count":9223372036854775807},)"
      R"({"name":"c","saved_bytes":10,"seconds":1,"count":9223372036854775808}]})");
  for (const auto& args : {std::vector<std::string>{"advise", file}, std::vector<std::string>{"advise", file, "--json"},
                           std::vector<std::string>{"advise", file, "--budget", "100B"}}) {
    const CliResult r = run(args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("$.regions[2].count: is 9223372036854775808, which takes the regions' counts past 64 bits "
                         "(18446744073709551615 before it)"),
              std::string::npos)
        << r.err;
  }
  // Up to the largest 64-bit sum, the figure is exact.
  const std::string fits = dir.write(
      "fits.json",
      R"({"kind":"region_profile","schema_version":1,"base_bytes":100,"regions":[)"
      R"({"name":"a","saved_bytes":10,"seconds":1,"count":9223372036854775808},)"
      R"({"name":"b","saved_bytes":10,"seconds":1,"count":9223372036854775807}]})");
  const CliResult r = run({"advise", fits, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json points = nlohmann::json::parse(r.out)["frontier"];
  std::uint64_t most_saved = 0;
  for (const auto& point : points) most_saved = std::max(most_saved, point["saved_regions"].get<std::uint64_t>());
  EXPECT_EQ(most_saved, 18446744073709551615ULL) << r.out;
}

// A number past a double's range (1e400) is refused by the JSON reader the producers' dumps share:
// bad input naming the field, for every command that reads those dumps, never an abort.
TEST(ProducerDumps, ANumberPastADoubleIsBadInputNamingTheField) {
  TempDir dir;
  auto with_1e400 = [&](const std::string& fixture, const std::string& field, const std::string& name) {
    std::string text = data_text(fixture);
    const std::size_t at = text.find("\"" + field + "\": ");
    EXPECT_NE(at, std::string::npos) << fixture << " has no " << field;
    const std::size_t value = at + field.size() + 4;
    const std::size_t end = text.find_first_of(",\n}", value);
    text.replace(value, end - value, "1e400");
    return dir.write(name, text);
  };
  const std::string profile = with_1e400("region-profile.json", "seconds", "profile.json");
  const std::string stage = with_1e400("stage-profile-0.json", "params", "stage.json");
  const std::string prediction = with_1e400("pipeline-prediction.json", "microbatches", "prediction.json");
  struct Case {
    std::vector<std::string> args;
    std::string field;
  };
  const Case cases[] = {
      {{"advise", profile}, "$.regions[0].seconds"},
      {{"advise", profile, "--budget", "2MiB"}, "$.regions[0].seconds"},
      {{"advise", profile, "--peak", "2MiB", "--json"}, "$.regions[0].seconds"},
      {{"predict", stage, data_path("stage-profile-1.json"), "--schedule", "1f1b", "--microbatches", "4"},
       "$.bytes.params"},
      {{"ranks", data_path("snapshot-peak.json"), "--predicted", prediction}, "$.microbatches"},
  };
  for (const Case& c : cases) {
    const CliResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args[0] << ": " << r.err;
    EXPECT_NE(r.err.find(c.field + ": is a number too large for a double (number overflow parsing '1e400'); write "
                                   "a finite number"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// A profile that is not JSON is refused in the reader's words, without the JSON library's
// exception tag.
TEST(Advise, AProfileThatIsNotJsonIsRefusedInWords) {
  TempDir dir;
  const CliResult r = run({"advise", dir.write("cut.json", "{\"kind\": ")});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: " + dir.path("cut.json") +
                       ": byte 9: the input ends inside $.kind: the file is cut short (a job killed mid-write?)\n");
  const CliResult comma = run({"advise", dir.write("comma.json", "{\"kind\": 1,, \"x\": 2}")});
  EXPECT_EQ(comma.code, 2);
  EXPECT_NE(comma.err.find("comma.json: byte 11: syntax error while parsing object key"), std::string::npos)
      << comma.err;
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
}

// A frontier is one plan per budget, each deciding every region: --steps times regions is bounded,
// and the message says by what and how to ask for less.
TEST(Advise, AFrontierTooLargeToComputeIsRefusedNamingTheLimit) {
  nlohmann::json profile = nlohmann::json::parse(data_text("region-profile.json"));
  nlohmann::json regions = nlohmann::json::array();
  std::uint64_t all_saved = 0;
  for (int i = 0; i < 2000; ++i) {
    regions.push_back(
        {{"name", "block" + std::to_string(i) + "::mlp"}, {"saved_bytes", 4096 + i}, {"seconds", 0.001 + i * 1e-6}});
    all_saved += static_cast<std::uint64_t>(4096 + i);
  }
  profile["regions"] = regions;
  profile["all_saved_bytes"] = all_saved + profile["base_bytes"].get<std::uint64_t>();
  TempDir dir;
  const std::string file = dir.write("many.json", profile.dump());
  const CliResult r = run({"advise", file, "--steps", "1000"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "remat-report advise: --steps 1000 over 2000 regions is 2000000 plans' decisions, more than the 1000000 a "
            "frontier may take; give --steps 500 or fewer, --group to plan regions that differ only in numbers as "
            "one, or pass --budget for one plan\n");
  EXPECT_EQ(r.out, "");
  const CliResult fewer = run({"advise", file, "--steps", "10", "--csv"});
  ASSERT_EQ(fewer.code, 0) << fewer.err;
  EXPECT_EQ(fewer.out.rfind("budget_bytes,kept_bytes,recompute_seconds,saved_regions\n", 0), 0u) << fewer.out;
}

}  // namespace
}  // namespace remat::report::testing
