// One grammar for every option that takes bytes (advise --budget/--peak/--host-budget, whatif
// --capacity, plan --buffer-bytes): decimal and binary units each their own (GB = 10^9, GiB = 2^30),
// KB refused (some read it as 1024 bytes), fractions read exactly, bare numbers as each option
// documents them.
#include "cli_runner.hpp"
#include "core/byte_size.hpp"
#include "core/errors.hpp"

#include <remat/budget/budget_text.hpp>
#include <remat/budget/error.hpp>

#include <nlohmann/json.hpp>

namespace remat::report::testing {
namespace {

const SizeRules kBare{.bare_bytes = true, .zero_refused = "zero bytes"};
const SizeRules kUnitNeeded{.bare_bytes = false, .zero_refused = "zero bytes"};

std::string refusal(std::string_view text, const SizeRules& rules) {
  try {
    parse_byte_size("--size", text, rules);
  } catch (const UsageError& error) {
    return error.what();
  }
  return "accepted";
}

TEST(ByteSizes, DecimalAndBinaryUnitsAreEachTheirOwn) {
  EXPECT_EQ(parse_byte_size("--size", "80GB", kBare), 80'000'000'000u);
  EXPECT_EQ(parse_byte_size("--size", "80GiB", kBare), 80ull << 30);
  EXPECT_EQ(parse_byte_size("--size", "64MB", kBare), 64'000'000u);
  EXPECT_EQ(parse_byte_size("--size", "64 MiB", kBare), 64u << 20);
  EXPECT_EQ(parse_byte_size("--size", "9kB", kBare), 9000u);
  EXPECT_EQ(parse_byte_size("--size", "9KiB", kBare), 9216u);
  EXPECT_EQ(parse_byte_size("--size", "1.5GiB", kBare), 1610612736u);
  EXPECT_EQ(parse_byte_size("--size", "0.1 GiB", kBare), 107374182u);  // rounded down
  EXPECT_EQ(parse_byte_size("--size", " 40MiB\t", kBare), 40u << 20);
  EXPECT_EQ(parse_byte_size("--size", "18446744073709551615", kBare), UINT64_MAX);
}

TEST(ByteSizes, BareNumbersAreBytesOnlyWhereTheOptionSaysSo) {
  EXPECT_EQ(parse_byte_size("--size", "85899345920", kBare), 85899345920u);
  EXPECT_EQ(refusal("70", kUnitNeeded).substr(0, 36), "--size '70': no unit (bytes? GiB?); ");
  EXPECT_NE(refusal("70", kUnitNeeded).find("write a number with a unit: B, KiB"), std::string::npos);
  EXPECT_NE(refusal("7x", kBare).find("write a number of bytes (85899345920) or a number with a unit"),
            std::string::npos);
}

TEST(ByteSizes, RefusalsNameTheTextAndTheProblem) {
  EXPECT_EQ(refusal("-1", kBare).substr(0, 31), "--size '-1': a size has no sign");
  EXPECT_EQ(refusal("12XB", kBare).substr(0, 38), "--size '12XB': unknown unit 'XB'; writ");
  EXPECT_EQ(refusal("0.5B", kBare).substr(0, 35), "--size '0.5B': a fraction of a byte");
  EXPECT_EQ(refusal("0GiB", kBare).substr(0, 26), "--size '0GiB': zero bytes;");
  EXPECT_EQ(refusal("16777216TiB", kBare).substr(0, 48), "--size '16777216TiB': more than 2^64 - 1 bytes; ");
  EXPECT_EQ(refusal("", kBare).substr(0, 17), "--size '': empty;");
  EXPECT_EQ(refusal("1e3", kBare).substr(0, 30), "--size '1e3': unknown unit 'e3");
  EXPECT_EQ(refusal("9KB", kBare).substr(0, 33), "--size '9KB': unknown unit 'KB'; ");
  EXPECT_EQ(parse_byte_size("--size", "0B", SizeRules{.bare_bytes = false, .zero_refused = {}}), 0u);
}

TEST(ByteSizes, EveryTextRematsBudgetsAcceptMeansTheSameBytes) {
  for (const char* text : {"70GiB", "512 MiB", "1.5GiB", "80GB", "1703936B", "0.009GB", "0.1 GiB", "3.25 TB",
                           "1.0000000001PiB", "12kB", " 7 MiB "}) {
    EXPECT_EQ(parse_byte_size("--budget", text, kUnitNeeded), budget::parse_budget(text, "--budget")) << text;
  }
}

TEST(ByteSizes, EveryCommandTakesTheSameForms) {
  const CliResult plan =
      run({"plan", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--buffer-bytes", "64MB", "--json"});
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_EQ(nlohmann::json::parse(plan.out)["buffer_bytes"], 64'000'000) << plan.out;
  const CliResult fraction =
      run({"plan", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--buffer-bytes", "1.5GiB", "--json"});
  ASSERT_EQ(fraction.code, 0) << fraction.err;
  EXPECT_EQ(nlohmann::json::parse(fraction.out)["buffer_bytes"], 1610612736) << fraction.out;

  const CliResult whatif = run({"whatif", data_path("trace.jsonl"), "--capacity", "1.5GiB", "--json"});
  ASSERT_EQ(whatif.code, 0) << whatif.err;
  EXPECT_EQ(nlohmann::json::parse(whatif.out)["capacity_bytes"], 1610612736) << whatif.out;
  const CliResult bare = run({"whatif", data_path("trace.jsonl"), "--capacity", "85899345920", "--json"});
  ASSERT_EQ(bare.code, 0) << bare.err;
  EXPECT_EQ(nlohmann::json::parse(bare.out)["capacity_bytes"], 85899345920) << bare.out;

  const CliResult advise = run({"advise", data_path("region-profile.json"), "--budget", "9000kB", "--json"});
  ASSERT_EQ(advise.code, 0) << advise.err;
  EXPECT_EQ(nlohmann::json::parse(advise.out)["budget_bytes"], 9'000'000) << advise.out;
  const CliResult no_unit = run({"advise", data_path("region-profile.json"), "--budget", "70"});
  EXPECT_EQ(no_unit.code, 1);
  EXPECT_EQ(no_unit.err.substr(0, 58), "remat-report advise: --budget '70': no unit (bytes? GiB?);") << no_unit.err;

  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"plan", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--buffer-bytes",
                                 "12XB"},
        std::vector<std::string>{"whatif", data_path("trace.jsonl"), "--capacity", "12XB"},
        std::vector<std::string>{"advise", data_path("region-profile.json"), "--budget", "12XB"}}) {
    const CliResult r = run(args);
    EXPECT_EQ(r.code, 1) << args[0];
    EXPECT_NE(r.err.find("'12XB': unknown unit 'XB'; write "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("kB, MB, GB, TB, PB (powers of 1000"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace remat::report::testing
