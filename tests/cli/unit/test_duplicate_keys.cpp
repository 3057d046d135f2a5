// A key twice in any object of any dump is refused by every subcommand, naming the file and
// the JSON path of the second occurrence: readers disagree on which value wins.
#include "cli_runner.hpp"
#include "core/errors.hpp"
#include "reader/json_document.hpp"

namespace remat::report::testing {
namespace {

std::string duplicate(const std::string& key) {
  return "duplicate key '" + key +
         "': the object holds it more than once, and JSON readers disagree on which value counts; keep one";
}

// `text` with `insert` placed right after the first `anchor`.
std::string inserted_after(const std::string& text, const std::string& anchor, const std::string& insert) {
  const std::size_t at = text.find(anchor);
  EXPECT_NE(at, std::string::npos) << anchor;
  std::string out = text;
  out.insert(at + anchor.size(), insert);
  return out;
}

// A trace whose one event is `line`, written into `dir`: its file, and how errors name the line.
struct OneEventTrace {
  std::string file, line_at;
};
OneEventTrace one_event_trace(TempDir& dir, const std::string& line) {
  const std::string header = trace_text({});
  const std::string file = dir.write("dup.jsonl", header + line + "\n");
  return {file, file + ": line 2 (byte " + std::to_string(header.size()) + "): "};
}

TEST(DuplicateKeys, ASnapshotBlockKeyTwiceIsRefusedByEverySubcommandNamingItsPath) {
  TempDir dir;
  const std::string file =
      dir.write("dup.json", inserted_after(data_text("snapshot-end.json"), R"("blocks":[{)", R"("size":7,)"));
  expect_refused_by_every_command(file, dir, file + ": $.segments[0].blocks[0].size: " + duplicate("size"));
}

TEST(DuplicateKeys, ATraceHeaderKeyTwiceIsRefusedByEverySubcommand) {
  TempDir dir;
  const std::string file = dir.write("dup.jsonl", inserted_after(trace_text({event("alloc", 1, 4096, 512, 1)}),
                                                                 R"("host":"h",)", R"("host":"other",)"));
  expect_refused_by_every_command(file, dir, file + ": $.host: " + duplicate("host"));
}

TEST(DuplicateKeys, AnEventKeyTwiceIsRefusedByEverySubcommandNamingItsLine) {
  TempDir dir;
  const OneEventTrace trace =
      one_event_trace(dir, R"({"action":"alloc","time_us":1,"address":4096,"size":512,"stream":0,"tag":1,"tag":2})");
  expect_refused_by_every_command(trace.file, dir, trace.line_at + "$.tag: " + duplicate("tag"));
}

TEST(DuplicateKeys, AnUnknownEventKeyTwiceIsRefusedToo) {
  TempDir dir;
  const OneEventTrace trace = one_event_trace(
      dir, R"({"action":"alloc","time_us":1,"address":4096,"size":512,"stream":0,"tag":1,"note":1,"note":2})");
  const CliResult r = run({"memory", trace.file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: " + trace.line_at + "$.note: " + duplicate("note") + "\n");
}

TEST(DuplicateKeys, KeysThatDifferOnlyInTheirEscapesAreDuplicates) {
  TempDir dir;
  const OneEventTrace trace = one_event_trace(
      dir, R"({"action":"alloc","time_us":1,"address":4096,"size":512,"siz\u0065":1,"stream":0,"tag":1})");
  const CliResult r = run({"validate", trace.file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "invalid: " + trace.line_at + "$.size: " + duplicate("size") + "\n");
}

TEST(DuplicateKeys, ReportKindsRefuseThemAtTheirPath) {
  TempDir dir;
  struct Case {
    std::string fixture, anchor, insert, command, message;
  };
  const Case cases[] = {
      {"oom.json", R"("request":{)", R"("rounded_bytes":1,)", "oom",
       "$.request.rounded_bytes: " + duplicate("rounded_bytes")},
      {"memory-report.json", R"("checkpoint": )", R"("x", "checkpoint": )", "memory",
       "$.checkpoint: " + duplicate("checkpoint")},
      {"saved-report.json", R"("label": "PowBackward0",)", R"( "label": "x",)", "summary",
       "$.node_groups[0].label: " + duplicate("label")},
      {"remat-trace.json", R"("decision": "save",)", R"( "decision": "recompute",)", "validate",
       "$.scopes[0].regions[0].decision: " + duplicate("decision")},
  };
  for (const Case& c : cases) {
    const std::string file = dir.write(c.fixture, inserted_after(data_text(c.fixture), c.anchor, c.insert));
    const CliResult r = run({c.command, file});
    EXPECT_EQ(r.code, 2) << c.fixture;
    EXPECT_EQ(r.err, (c.command == "validate" ? "invalid: " : "remat-report: ") + file + ": " + c.message + "\n");
  }
}

TEST(DuplicateKeys, KindsWithoutARendererAreCheckedToo) {
  TempDir dir;
  const std::string file =
      dir.write("plan.json", R"({"kind":"pipeline-plan","schema_version":1,"stages":[{"id":0},{"id":1,"id":2}]})");
  const CliResult r = run({"summary", file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: " + file + ": $.stages[1].id: " + duplicate("id") + "\n");
}

TEST(DuplicateKeys, LargeObjectsAreCheckedAsWellAsSmallOnes) {
  std::string text = "{";
  for (int i = 0; i < 40; ++i) text += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  text += R"("k17":0})";
  const simdjson::padded_string padded(text);
  simdjson::dom::parser parser;
  try {
    parse_json(parser, std::string_view(padded.data(), padded.size()));
    FAIL() << "a duplicated key was accepted";
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()), "$.k17: " + duplicate("k17"));
  }
}

}  // namespace
}  // namespace remat::report::testing
