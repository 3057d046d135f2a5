// The checkpoint and OOM report kinds: `oom` on files a user will really pass it, and bad
// report dumps failing with one line naming the JSON path.
#include "cli_runner.hpp"

#include <algorithm>

namespace remat::report::testing {
namespace {

const std::string kHeader =
    R"("schema_version":1,"producer":"test","created_at":"2026-01-01T00:00:00Z","host":"h","pid":1,"rank":0,"device":0)";

// An OOM report whose numbers (and one replaced field) are given; `fragmentation` defaults to a
// case where empty-cache covers the 64 MiB request.
std::string oom_text(
    const std::string& request = R"({"requested_bytes":67108864,"rounded_bytes":67108864,"segment_bytes":67108864})",
    const std::string& fragmentation =
        R"({"largest_free_block":104857600,"cached_free_bytes":104857600,"releasable_bytes":104857600,)"
        R"("fragmented_free_bytes":0,"free_blocks_in_split_segments":0,"internal_bytes":0})") {
  return R"({"kind":"oom",)" + kHeader + R"(,"backend":"cuda","request":)" + request +
         R"(,"memory":{"device_free_bytes":0,"device_total_bytes":17179869184,"reserved_bytes":8589934592,)"
         R"("allocated_bytes":8485076992,"requested_bytes":8485076992,"active_bytes":8485076992,"segments":9},)"
         R"("fragmentation":)" +
         fragmentation +
         R"(,"num_ooms":1,"config":"backend:cuda","holders":{"by_region":[{"name":"layers.0","bytes":8485076992,)"
         R"("blocks":4,"saved_bytes":0}],"by_recv_slot":[],"by_site":[],"by_phase":[]},"tag_stack":["region layers.0"],)"
         R"("last_events":[{"action":"oom","time_us":5,"address":0,"size":67108864,"stream":0,"region":"layers.0"}]})";
}

void expect_bad_input(const CliResult& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line expected: " << r.err;
}

// `summary` of a dump holding `text` succeeds and prints `start` first; its whole output.
std::string expect_summary_starts_with(const std::string& text, const std::string& start) {
  TempDir dir;
  const CliResult r = run({"summary", dir.write("dump.json", text)});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(start, 0), 0u) << r.out;
  return r.out;
}

TEST(OomCommand, SuggestsEmptyCacheWhenReleasableCoversTheRequest) {
  TempDir dir;
  const CliResult r = run({"oom", dir.write("oom.json", oom_text())});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("  - empty-cache would have freed 100.00 MiB in whole cached segments (enough for this "
                       "request of 64.00 MiB)"),
            std::string::npos)
      << r.out;
}

TEST(OomCommand, JsonHoldsTheSuggestionsWithTheirNumbers) {
  TempDir dir;
  const CliResult r = run({"oom", dir.write("oom.json", oom_text()), "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(R"("kind": "empty_cache")"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(R"("frees_bytes": 104857600)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(R"("releasable_by_empty_cache": 104857600)"), std::string::npos) << r.out;
}

TEST(OomCommand, SummaryOfAnOomDumpPrintsTheSameAnalysis) {
  TempDir dir;
  const std::string path = dir.write("oom.json", oom_text());
  const CliResult oom = run({"oom", path});
  const CliResult summary = run({"summary", path});
  EXPECT_EQ(summary.code, 0) << summary.err;
  EXPECT_EQ(oom.out, summary.out);
}

TEST(OomCommand, ASnapshotIsRefusedNamingTheKindItReads) {
  TempDir dir;
  const std::string snapshot = R"({"kind":"snapshot",)" + kHeader + "}";
  const std::string path = dir.write("s.json", snapshot);
  expect_bad_input(run({"oom", path}), path +
                                           ": `remat-report oom` reads OOM reports, which the allocator writes as "
                                           "oom-*.json when an allocation fails (kind oom); this is a snapshot "
                                           "dump: `remat-report summary " +
                                           path + "` reads it");
}

TEST(OomCommand, AMissingFieldNamesItsJsonPath) {
  TempDir dir;
  const std::string text = oom_text(R"({"requested_bytes":1,"segment_bytes":2})");
  expect_bad_input(run({"oom", dir.write("m.json", text)}), "$.request.rounded_bytes: missing required field");
}

TEST(OomCommand, AWrongTypeNamesThePathAndTheTypeFound) {
  TempDir dir;
  const std::string text = oom_text(R"({"requested_bytes":"64MiB","rounded_bytes":1,"segment_bytes":2})");
  expect_bad_input(run({"oom", dir.write("t.json", text)}),
                   "$.request.requested_bytes: expected a non-negative integer, found a string");
}

TEST(OomCommand, ANegativeByteCountIsRefused) {
  TempDir dir;
  const std::string text =
      oom_text(R"({"requested_bytes":1,"rounded_bytes":1,"segment_bytes":2})",
               R"({"largest_free_block":-1,"cached_free_bytes":0,"releasable_bytes":0,"fragmented_free_bytes":0,)"
               R"("free_blocks_in_split_segments":0,"internal_bytes":0})");
  expect_bad_input(run({"oom", dir.write("n.json", text)}),
                   "$.fragmentation.largest_free_block: must not be negative (got -1)");
}

// The request's pool is one of both pools: figures past both pools' are refused, naming the field
TEST(OomCommand, RequestPoolFiguresPastBothPoolsAreRefused) {
  TempDir dir;
  const auto with_pool = [](const std::string& pool) {
    return oom_text(R"({"requested_bytes":67108864,"rounded_bytes":67108864,"segment_bytes":67108864})",
                    R"({"largest_free_block":1048576,"cached_free_bytes":29360128,"releasable_bytes":0,)"
                    R"("fragmented_free_bytes":29360128,"free_blocks_in_split_segments":9,"internal_bytes":0,)"
                    R"("request_pool":)" +
                        pool + "}");
  };
  expect_bad_input(run({"oom", dir.write("a.json", with_pool(R"({"pool":"large","free_bytes":293601280,)"
                                                             R"("fragmented_free_bytes":0,)"
                                                             R"("free_blocks_in_split_segments":0})"))}),
                   "$.fragmentation.request_pool.free_bytes: 293601280 is more than "
                   "fragmentation.cached_free_bytes (29360128)");
  expect_bad_input(run({"oom", dir.write("b.json", with_pool(R"({"pool":"large","free_bytes":1048576,)"
                                                             R"("fragmented_free_bytes":2097152,)"
                                                             R"("free_blocks_in_split_segments":1})"))}),
                   "$.fragmentation.request_pool.fragmented_free_bytes: 2097152 is more than "
                   "fragmentation.request_pool.free_bytes (1048576)");
  expect_bad_input(run({"oom", dir.write("c.json", with_pool(R"({"pool":"medium","free_bytes":0,)"
                                                             R"("fragmented_free_bytes":0,)"
                                                             R"("free_blocks_in_split_segments":0})"))}),
                   "$.fragmentation.request_pool.pool: unknown pool 'medium'; expected small or large");
  std::string no_oom = oom_text();
  no_oom.replace(no_oom.find(R"("num_ooms":1)"), 12, R"("num_ooms":0)");
  expect_bad_input(run({"oom", dir.write("d.json", no_oom)}), "$.num_ooms: is 0");
}

// Each grouping of holders divides the allocated bytes among them (the allocator bills every
// live block to one holder of each), so a grouping's rows add up to at most allocated_bytes.
TEST(OomCommand, HoldersAddingUpPastTheAllocatedBytesAreRefusedNamingTheRow) {
  TempDir dir;
  const std::string rows = R"("by_region":[{"name":"layers.0","bytes":8485076992,"blocks":4,"saved_bytes":0}])";
  std::string text = oom_text();
  ASSERT_NE(text.find(rows), std::string::npos);
  const std::string past =
      dir.write("past.json", std::string(text).replace(text.find(rows), rows.size(),
                                                       R"("by_region":[{"name":"a","bytes":18446744073709551615,)"
                                                       R"("blocks":4,"saved_bytes":0}])"));
  for (const char* command : {"oom", "summary", "validate"}) {
    const CliResult r = run({command, past});
    EXPECT_EQ(r.code, 2) << command << ": " << r.out;
    EXPECT_NE(
        r.err.find(past + ": $.holders.by_region[0].bytes: 18446744073709551615 bytes, with the 0 rows before, add up "
                          "to more than $.memory.allocated_bytes (8485076992): each grouping of holders divides the "
                          "allocated bytes among them, so its rows add up to at most that; write the dump again from "
                          "the allocator or fix the figures"),
        std::string::npos)
        << command << ": " << r.err;
  }
  // Two rows, each within the total, whose sum is not; rows adding up to exactly the total are read.
  const auto by_site = [&](std::uint64_t second) {
    return std::string(text).replace(text.find(R"("by_site":[])"), 12,
                                     R"("by_site":[{"name":"a","bytes":4242538496,"blocks":2,"saved_bytes":0},)"
                                     R"({"name":"b","bytes":)" +
                                         std::to_string(second) + R"(,"blocks":2,"saved_bytes":0}])");
  };
  expect_bad_input(run({"oom", dir.write("sum.json", by_site(4242538497))}),
                   "$.holders.by_site[1].bytes: 4242538497 bytes, with the 1 rows before, add up to more than "
                   "$.memory.allocated_bytes (8485076992)");
  const CliResult exact = run({"oom", dir.write("exact.json", by_site(4242538496))});
  EXPECT_EQ(exact.code, 0) << exact.err;
}

TEST(RematTrace, UnknownDecisionNamesItsPath) {
  TempDir dir;
  const std::string text = R"({"kind":"remat-trace",)" + kHeader +
                           R"(,"scopes":[{"name":"layers.0","regions":[{"name":"mlp","decision":"maybe"}]}]})";
  expect_bad_input(run({"summary", dir.write("r.json", text)}),
                   "$.scopes[0].regions[0].decision: unknown decision 'maybe'; expected save or recompute");
}

TEST(RematTrace, IdenticalConsecutiveScopesAreFoldedAndCounted) {
  const std::string scope = R"({"name":"layers.0","regions":[{"name":"mlp","decision":"recompute"}]})";
  const std::string text =
      R"({"kind":"remat-trace",)" + kHeader + R"(,"scopes":[)" + scope + "," + scope + "," + scope + "]}";
  const std::string out = expect_summary_starts_with(text,
                                                     "remat trace: 3 checkpoint(s), 3 region(s)\n"
                                                     "scope [layers.0]  x3 (identical consecutive scopes folded)\n"
                                                     "  mlp: recompute\n");
  EXPECT_NE(out.find("note: 2 scope(s) folded"), std::string::npos) << out;
}

TEST(SavedReport, GroupCountOfZeroIsRefused) {
  TempDir dir;
  const std::string text =
      R"({"kind":"saved-report",)" + kHeader +
      R"(,"total_bytes":10,"region_bytes":10,"outside_bytes":0,"regions":1,)"
      R"("region_groups":[{"label":"layers.0","bytes":10,"count":0,"storages":1}],"node_groups":[]})";
  expect_bad_input(run({"summary", dir.write("s.json", text)}), "$.region_groups[0].count: must be at least 1");
}

TEST(SavedReport, TextMatchesTheRuntimeFormatterIncludingMiB) {
  const std::string text = R"({"kind":"saved-report",)" + kHeader +
                           R"(,"total_bytes":6292480,"region_bytes":6291456,"outside_bytes":1024,"regions":3,)"
                           R"("region_groups":[{"label":"block.0-2","bytes":6291456,"count":3,"storages":12}],)"
                           R"("node_groups":[{"label":"MulBackward0","bytes":1024,"count":2,"storages":2}]})";
  expect_summary_starts_with(text,
                             "saved for backward: 6.00 MiB resident -- 3 region(s) 6.00 MiB, outside regions 1.00 KiB\n"
                             "  2.00 MiB  x3  block.0-2  (4 storages each)\n"
                             "  1.00 KiB  MulBackward0 (x2)\n");
}

TEST(MemoryReport, SlotGroupingIsRefusedNamingTheGroupingsItHas) {
  TempDir dir;
  const std::string text = R"({"kind":"memory-report",)" + kHeader + R"(,"checkpoint":"layers.0","regions":[]})";
  expect_bad_input(run({"memory", dir.write("m.json", text), "--by", "slot"}),
                   "`remat-report memory --by slot`: a memory-report groups by region or site, not by slot; use --by "
                   "region or --by site");
}

TEST(MemoryReport, SiteGroupingBillsARegionOfOneSiteItsExactBytes) {
  TempDir dir;
  const std::string text =
      R"({"kind":"memory-report",)" + kHeader +
      R"(,"checkpoint":"layers.0","regions":[{"region":"layers.0::a","bytes":4096,"storages":1,"tensors":[)"
      R"({"name":"t0","shape":[1024],"dtype":"Float","storage_bytes":4096,"site":"attn.qkv"},)"
      R"({"name":"t1","shape":[2,512],"dtype":"Float","storage_bytes":4096,"site":"attn.qkv"}]}]})";
  const CliResult r = run({"memory", dir.write("m.json", text), "--by", "site", "--csv"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "site,placeholder,resident_bytes,share,tensors\nattn.qkv,false,4096,1,2\ntotal,true,4096,1,2\n");
}

}  // namespace
}  // namespace remat::report::testing
