// remat-report's own labels -- "(untagged)", "(no site)", "<no site>", "(N more)", "other (N
// groups)" -- never merge with a name from the dump that reads the same: the groups stay apart
// in every view, text quotes the look-alike name, JSON and CSV mark the placeholder.
#include "analysis/timeline_series.hpp"
#include "cli_runner.hpp"
#include "output/display_names.hpp"

#include <nlohmann/json.hpp>

namespace remat::report::testing {
namespace {

// Untagged memory (100 B), a region literally named "(untagged)" with a site literally named
// "(no site)" (50 B), and layers.0 without a site (30 B).
std::string look_alike_trace() {
  const std::string header =
      R"({"kind":"trace","schema_version":1,"producer":"test","created_at":"2026-01-01T00:00:00Z","host":"h","pid":1,)"
      R"j("rank":0,"device":0,"names":["","(untagged)","(no site)","layers.0"],)j"
      R"("tags":[{"region":0,"policy":"none","phase":"other","site":0,"recv":null},)"
      R"({"region":1,"policy":"save","phase":"forward","site":2,"recv":null},)"
      R"({"region":3,"policy":"none","phase":"backward","site":0,"recv":null}],"event_count":null})";
  return header + "\n" + event("alloc", 1, 4096, 100, 0) + "\n" + event("alloc", 2, 8192, 50, 1) + "\n" +
         event("alloc", 3, 12288, 30, 2) + "\n";
}

TEST(OwnLabels, ARegionNamedLikeUntaggedStaysApartInTheMemoryTable) {
  TempDir dir;
  const CliResult r = run({"memory", dir.write("t.jsonl", look_alike_trace())});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "Live and peak bytes by region\n"
            "region         live  live %   peak  peak %  live allocs  allocs\n"
            "(untagged)    100 B   55.6%  100 B   55.6%            1       1\n"
            "\"(untagged)\"   50 B   27.8%   50 B   27.8%            1       1\n"
            "layers.0       30 B   16.7%   30 B   16.7%            1       1\n"
            "---------------------------------------------------------------\n"
            "total         180 B  100.0%  180 B       -            3       3\n"
            "note: the total's peak is the peak of all groups together, not the sum of group peaks\n");
}

TEST(OwnLabels, JsonAndCsvGiveTheNameUnchangedAndMarkThePlaceholder) {
  TempDir dir;
  const std::string file = dir.write("t.jsonl", look_alike_trace());
  const CliResult csv = run({"memory", file, "--by", "site", "--csv"});
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(csv.out,
            "site,placeholder,live_bytes,live_share,peak_bytes,peak_share,live_count,allocations\n"
            "(no site),true,130,0.7222222222222222,130,0.7222222222222222,2,2\n"
            "(no site),false,50,0.2777777777777778,50,0.2777777777777778,1,1\n"
            "total,true,180,1,180,,3,3\n");
  const CliResult json = run({"memory", file, "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const nlohmann::json rows = nlohmann::json::parse(json.out)["memory"];
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["region"], "(untagged)");
  EXPECT_EQ(rows[0]["placeholder"], true);
  EXPECT_EQ(rows[0]["live_bytes"], 100);
  EXPECT_EQ(rows[1]["region"], "(untagged)");
  EXPECT_EQ(rows[1]["placeholder"], false);
  EXPECT_EQ(rows[1]["live_bytes"], 50);
}

TEST(OwnLabels, DiffJoinsGroupsByNameAndPlaceholderTogether) {
  TempDir dir;
  const std::string file = dir.write("t.jsonl", look_alike_trace());
  const CliResult r = run({"diff", file, file, "--csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "region,placeholder,live_before,live_after,live_change,peak_before,peak_after,peak_change\n"
            "(untagged),false,50,50,0,50,50,0\n"
            "(untagged),true,100,100,0,100,100,0\n"
            "layers.0,false,30,30,0,30,30,0\n"
            "total,true,180,180,0,180,180,0\n");
}

TEST(OwnLabels, TheTraceListingQuotesLookAlikeNames) {
  TempDir dir;
  const CliResult r = run({"trace", dir.write("t.jsonl", look_alike_trace())});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("other      (untagged)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("forward    \"(untagged)\" @ \"(no site)\"\n"), std::string::npos) << r.out;
}

TEST(OwnLabels, TimelineSeriesStayApartAndSayWhichIsThePlaceholder) {
  TempDir dir;
  const std::string svg_path = dir.path("t.svg");
  const CliResult r = run({"timeline", dir.write("t.jsonl", look_alike_trace()), "-o", svg_path});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(svg_path);
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(svg.find(R"j(data-label="(untagged)" data-placeholder="true")j"), std::string::npos);
  EXPECT_NE(svg.find(R"j(data-label="(untagged)" data-placeholder="false")j"), std::string::npos);
  EXPECT_NE(svg.find(">&quot;(untagged)&quot; (50 B)</text>"), std::string::npos) << "legend of the named region";
  EXPECT_NE(svg.find(">(untagged) (100 B)</text>"), std::string::npos) << "legend of untagged memory";
}

TEST(OwnLabels, ASnapshotRegionNamedLikeUntaggedStaysApart) {
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  for (nlohmann::json& name : snapshot["names"]) {
    if (name == "layers.1") name = "(untagged)";
  }
  const CliResult r = run({"memory", dir.write("s.json", snapshot.dump()), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  int placeholders = 0, names = 0;
  const nlohmann::json parsed = nlohmann::json::parse(r.out);
  for (const nlohmann::json& row : parsed["memory"]) {
    if (row["region"] != "(untagged)") continue;
    (row["placeholder"].get<bool>() ? placeholders : names) += 1;
  }
  EXPECT_EQ(placeholders, 1);
  EXPECT_EQ(names, 1);
  const CliResult text = run({"memory", dir.path("s.json")});
  EXPECT_NE(text.out.find("\n(untagged)   "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\n\"(untagged)\"   "), std::string::npos) << text.out;
}

TEST(OwnLabels, AMemoryReportSiteNamedLikeNoSiteStaysApart) {
  TempDir dir;
  const std::string header =
      R"({"kind":"memory-report","schema_version":1,"producer":"test","created_at":"c","host":"h","pid":1,"rank":0,)"
      R"("device":0,"checkpoint":"c0","regions":[)";
  const std::string text =
      header +
      R"({"region":"a","bytes":4096,"storages":1,"tensors":[{"name":"t0","shape":[1024],"dtype":"Float","storage_bytes":4096,"site":""}]},)"
      R"({"region":"b","bytes":2048,"storages":1,"tensors":[{"name":"t1","shape":[512],"dtype":"Float","storage_bytes":2048,"site":"<no site>"}]}]})";
  const CliResult r = run({"memory", dir.write("m.json", text), "--by", "site", "--csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "site,placeholder,resident_bytes,share,tensors\n"
            "<no site>,true,4096,0.6666666666666666,1\n"
            "<no site>,false,2048,0.3333333333333333,1\n"
            "total,true,6144,1,2\n");
}

TEST(OwnLabels, ARegionNamedLikeTheFoldedRowIsQuoted) {
  TempDir dir;
  const std::string header =
      R"({"kind":"trace","schema_version":1,"producer":"test","created_at":"c","host":"h","pid":1,"rank":0,"device":0,)"
      R"j("names":["","(1 more)","b"],"tags":[{"region":0,"policy":"none","phase":"other","site":0,"recv":null},)j"
      R"({"region":1,"policy":"none","phase":"other","site":0,"recv":null},)"
      R"({"region":2,"policy":"none","phase":"other","site":0,"recv":null}],"event_count":null})";
  const std::string text =
      header + "\n" + event("alloc", 1, 4096, 300, 1) + "\n" + event("alloc", 2, 8192, 100, 2) + "\n";
  const CliResult r = run({"memory", dir.write("t.jsonl", text), "--top", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"(1 more)\"  300 B"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(1 more)    100 B"), std::string::npos) << r.out;
}

TEST(OwnLabels, ARegionNamedLikeTheOtherSeriesIsNotFolded) {
  TagTable tags;
  tags.names = {"", "other (9 groups)"};
  tags.tags = {Tag{}, Tag{1, Policy::none, Phase::other, 0, std::nullopt}};
  TimelineBuilder builder(tags, GroupBy::region, 16);
  builder.on_event(Event{Action::alloc, 0, 0x1000, 10, 0, 0});
  builder.on_event(Event{Action::alloc, 1, 0x2000, 20, 0, 1});
  const Timeline timeline = builder.finish(12);
  ASSERT_EQ(timeline.series.size(), 2u);
  EXPECT_EQ(timeline.series[0].label, GroupLabel::name("other (9 groups)"));
  EXPECT_FALSE(timeline.series[0].other);
  EXPECT_EQ(timeline.series[1].label, GroupLabel::own("(untagged)"));
}

TEST(OwnLabels, TheFirstNameMustBeTheEmptyName) {
  TempDir dir;
  std::string text = trace_text({event("alloc", 1, 4096, 512, 0)});
  text.replace(text.find(R"("names":["",)"), 12, R"("names":["x",)");
  const std::string file = dir.write("t.jsonl", text);
  const CliResult r = run({"memory", file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: " + file +
                       ": line 1 (byte 0): $.names[0]: must be the empty name, found 'x': index 0 stands for no name "
                       "(untagged memory, no site)\n");
}

TEST(ShownName, QuotesNamesThatReadLikeOwnLabelsAndKeepsThemDistinct) {
  EXPECT_EQ(shown_name("layers.0::attention"), "layers.0::attention");
  EXPECT_EQ(shown_name("(untagged)"), "\"(untagged)\"");
  EXPECT_EQ(shown_name("\"(untagged)\""), "\"\"(untagged)\"\"");
  EXPECT_EQ(shown_name("<no site>"), "\"<no site>\"");
  EXPECT_EQ(shown_name("other (2 groups)"), "\"other (2 groups)\"");
  EXPECT_EQ(shown_name("(3 more)"), "\"(3 more)\"");
  EXPECT_EQ(shown_name("(half"), "(half");
  EXPECT_EQ(shown_name("\"quoted\""), "\"quoted\"");
}

}  // namespace
}  // namespace remat::report::testing
