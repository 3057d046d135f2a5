// `diff` joins two dumps' groups: a side that cannot tell peaks shows "-" (unknown), never an
// invented 0; changes are exact across the whole 64-bit range or say why not; and one stream
// (standard input, a FIFO) is never read as both sides.
#include "cli_runner.hpp"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

namespace remat::report::testing {
namespace {

// snapshot-end.json with its tag stats replaced by one tag of region layers.0 holding `bytes`
// (live and peak).
std::string snapshot_holding(const TempDir& dir, const std::string& name, std::uint64_t bytes) {
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  const nlohmann::json stat = {{"current", bytes}, {"peak", bytes}, {"total", bytes}};
  const nlohmann::json count = {{"current", 1}, {"peak", 1}, {"total", 1}};
  snapshot["tag_stats"] = {{{"tag", 2}, {"bytes", stat}, {"requested_bytes", stat}, {"count", count}}};
  snapshot["stats"]["allocated_bytes"] = stat;
  return dir.write(name, snapshot.dump());
}

const nlohmann::json& row_of(const nlohmann::json& diff, const std::string& group) {
  for (const nlohmann::json& row : diff["diff"]) {
    if (row["region"] == group) return row;
  }
  throw std::runtime_error("no row for " + group);
}

TEST(Diff, AMemoryReportSideHasNoPeaksSoItsMissingGroupsShowUnknownNotZero) {
  const CliResult r =
      run({"diff", data_path("snapshot-end.json"), data_path("memory-report.json"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json diff = nlohmann::json::parse(r.out);
  // layers.0 holds 12 MiB live (peak 14 MiB) in the snapshot and is absent from the report.
  const nlohmann::json& layers0 = row_of(diff, "layers.0");
  EXPECT_EQ(layers0["peak_before"], 14680064);
  EXPECT_TRUE(layers0["peak_after"].is_null()) << layers0;
  EXPECT_TRUE(layers0["peak_change"].is_null()) << layers0;
  EXPECT_EQ(layers0["live_change"], -12582912);
  for (const nlohmann::json& row : diff["diff"]) EXPECT_TRUE(row["peak_after"].is_null()) << row;

  // Sorted by live change, since no peak change is known: 24 MiB, 12, 12, then 297.25 KiB.
  std::vector<std::int64_t> changes;
  for (const nlohmann::json& row : diff["diff"]) changes.push_back(row["live_change"].get<std::int64_t>());
  EXPECT_EQ(changes, (std::vector<std::int64_t>{-25165824, -12582912, -12582912, 304384, 0, 0, 0}));
}

TEST(Diff, AGroupMissingFromADumpWithPeaksHadAPeakOfZero) {
  TempDir dir;
  const std::string before = snapshot_holding(dir, "before.json", 4096);
  const CliResult r = run({"diff", before, data_path("snapshot-end.json"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json diff = nlohmann::json::parse(r.out);
  const nlohmann::json& layers1 = row_of(diff, "layers.1");
  EXPECT_EQ(layers1["peak_before"], 0);
  EXPECT_EQ(layers1["peak_after"], 14680064);
  EXPECT_EQ(layers1["peak_change"], 14680064);
}

TEST(Diff, AnIncreaseBeyond2To63IsShownExactly) {
  TempDir dir;
  const std::string small = snapshot_holding(dir, "small.json", 512);
  const std::string huge = snapshot_holding(dir, "huge.json", 18446744073709551614ull);
  CliResult r = run({"diff", small, huge, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json diff = nlohmann::json::parse(r.out);
  EXPECT_EQ(row_of(diff, "layers.0")["live_change"].get<std::uint64_t>(), 18446744073709551102ull);
  EXPECT_EQ(diff["diff_total"]["live_change"].get<std::uint64_t>(), 18446744073709551102ull) << diff;
  r = run({"diff", small, huge});
  EXPECT_NE(r.out.find("+16.00 EiB"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("+8.00 EiB"), std::string::npos) << r.out;
}

TEST(Diff, ADecreaseBeyond2To63IsClampedWithANote) {
  TempDir dir;
  const std::string small = snapshot_holding(dir, "small.json", 512);
  const std::string huge = snapshot_holding(dir, "huge.json", 18446744073709551614ull);
  const CliResult r = run({"diff", huge, small});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("-8.00 EiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: a decrease of more than 2^63 bytes does not fit a signed 64-bit number and shows as "
                       "-8.00 EiB (-9223372036854775808); compare the before and after columns"),
            std::string::npos)
      << r.out;
}

TEST(Diff, DumpsOfTwoKindsOrTwoRanksAreComparedWithANoteSayingSo) {
  CliResult r = run({"diff", data_path("snapshot-end.json"), data_path("memory-report.json")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("note: BEFORE is a snapshot dump and AFTER a memory-report dump: a memory-report counts what "
                       "one checkpoint keeps for backward, the other what the allocator holds; compare dumps of one "
                       "kind to see what changed"),
            std::string::npos)
      << r.out;
  TempDir dir;
  nlohmann::json other = nlohmann::json::parse(data_text("snapshot-end.json"));
  other["rank"] = 1;
  other["device"] = 1;
  r = run({"diff", data_path("snapshot-end.json"), dir.write("rank1.json", other.dump())});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("note: BEFORE is rank 0 (device 0) and AFTER rank 1 (device 1): compare dumps of one rank to "
                       "see what changed, or set ranks side by side with `remat-report ranks`"),
            std::string::npos)
      << r.out;
  // A snapshot and a trace replayed count the same memory
  r = run({"diff", data_path("snapshot-end.json"), data_path("trace.jsonl")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("note: BEFORE"), std::string::npos) << r.out;
}

TEST(Diff, AFifoNamedAsBothSidesIsOneStream) {
  TempDir dir;
  const std::string fifo = dir.path("dump.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliResult r = run({"diff", fifo, fifo});  // refused before either side is opened
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "remat-report diff: BEFORE (" + fifo + ") and AFTER (" + fifo +
                       ") read the same stream, which holds one dump; save one of them to a file and pass its path\n");
}

TEST(Diff, ARegularFileNamedAsBothSidesIsReadTwice) {
  const CliResult r = run({"diff", data_path("snapshot-end.json"), data_path("snapshot-end.json"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["diff_total"]["live_change"], 0);
}

}  // namespace
}  // namespace remat::report::testing
