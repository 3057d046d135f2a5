// Bad input a user will really send: every case exits 2 with one line naming where.
#include "cli_runner.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace remat::report::testing {
namespace {

void expect_bad_input(const CliResult& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line expected: " << r.err;
}

// `command` run on a trace of `events` (trace_text's header over them) is refused naming `needle`.
void expect_trace_refused(const std::string& command, const std::vector<std::string>& events,
                          const std::string& needle) {
  TempDir dir;
  expect_bad_input(run({command, dir.write("t.jsonl", trace_text(events))}), needle);
}

TEST(BadInput, EmptyFileIsReportedAsEmpty) {
  TempDir dir;
  expect_bad_input(run({"summary", dir.write("empty.json", "")}), "file is empty (0 bytes)");
}

TEST(BadInput, MissingFileNamesTheSystemError) {
  expect_bad_input(run({"summary", "/nonexistent/dump.json"}), "No such file or directory");
}

TEST(BadInput, TruncatedSnapshotReportsTheByteOffsetOfTheEnd) {
  TempDir dir;
  const std::string text = R"({"kind":"snapshot","schema_version":1,"names":["a",)";
  expect_bad_input(run({"summary", dir.write("cut.json", text)}), "byte " + std::to_string(text.size()));
}

TEST(BadInput, BinaryGarbageIsASyntaxErrorAtByteZero) {
  TempDir dir;
  expect_bad_input(run({"memory", dir.write("garbage.bin", std::string("\x01\x02\xff\xfe\x00garbage", 12))}), "byte 0");
}

TEST(BadInput, InvalidUtf8InAStringNamesItsByte) {
  TempDir dir;
  const std::string text = "{\"kind\":\"snap\xc3\x28shot\",\"schema_version\":1}";
  expect_bad_input(run({"summary", dir.write("utf8.json", text)}), "byte 13: invalid UTF-8");
}

TEST(BadInput, UnknownKindListsTheKindsThisBuildReads) {
  TempDir dir;
  expect_bad_input(run({"memory", dir.write("k.json", R"({"kind":"pipeline-plan-v9","schema_version":1})")}),
                   "$.kind: unknown dump kind 'pipeline-plan-v9'; this remat-report reads: snapshot, trace, oom, "
                   "remat-trace, memory-report, "
                   "saved-report");
}

TEST(Summary, KindsWithoutARendererStillShowTheirHeaderAndFields) {
  TempDir dir;
  const CliResult r = run(
      {"summary",
       dir.write(
           "r.json",
           R"({"kind":"pipeline-plan","schema_version":1,"producer":"p","created_at":"c","host":"h","pid":3,"rank":1,)"
           R"("device":0,"regions":[{"name":"a"},{"name":"b"}]})")});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("pipeline-plan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("regions  an array      2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: a pipeline-plan dump is what `remat-report plan --json` writes: the fields above are "
                       "all this command shows of it; `remat-report validate` checks it against schemas/"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("no renderer"), std::string::npos) << r.out;
}

TEST(BadInput, UnknownSchemaVersionIsRefused) {
  TempDir dir;
  expect_bad_input(run({"summary", dir.write("v.json", R"({"kind":"snapshot","schema_version":7})")}),
                   "$.schema_version: unsupported schema_version 7 for kind 'snapshot'");
}

TEST(BadInput, SnapshotMissingAFieldNamesItsPath) {
  TempDir dir;
  expect_bad_input(run({"summary", dir.write("m.json", R"({"kind":"snapshot","schema_version":1,"producer":"p"})")}),
                   "$.created_at: missing required field");
}

TEST(BadInput, MistypedTraceFieldNamesLineAndPath) {
  TempDir dir;
  const std::string text =
      trace_text({event("alloc", 1, 4096, 512, 1),
                  R"({"action":"alloc","time_us":2,"address":8192,"size":"big","stream":0,"tag":1})"});
  expect_bad_input(run({"memory", dir.write("t.jsonl", text)}), "line 3 (byte");
  expect_bad_input(run({"memory", dir.write("t2.jsonl", text)}),
                   "$.size: expected a non-negative integer, found a string");
}

TEST(BadInput, NegativeSizeIsRefused) {
  TempDir dir;
  const std::string text =
      trace_text({R"({"action":"alloc","time_us":2,"address":8192,"size":-5,"stream":0,"tag":1})"});
  expect_bad_input(run({"memory", dir.write("t.jsonl", text)}), "$.size: must not be negative (got -5)");
}

TEST(BadInput, IntegerBeyond64BitsNamesItsByteOffset) {
  TempDir dir;
  const std::string line =
      R"({"action":"alloc","time_us":2,"address":8192,"size":99999999999999999999999,"stream":0,"tag":1})";
  const std::string header = trace_text({});
  const std::size_t offset = header.size() + line.find("99999");
  expect_bad_input(run({"summary", dir.write("t.jsonl", header + line + "\n")}),
                   "byte " + std::to_string(offset) + ": integer 99999999999999999999999 does not fit in 64 bits");
}

// A number no double holds is refused with its JSON path, whether the document is parsed whole
// (an oom dump), value by value as a snapshot streams in, or line by line (a trace).
TEST(BadInput, ANumberTooLargeForADoubleNamesItsPath) {
  struct Case {
    std::string fixture, from, number, path;
  };
  for (const Case& c : {Case{"oom.json", "\"segment_bytes\":4294967296", "1e400", "$.request.segment_bytes"},
                        Case{"snapshot-end.json", "\"total_size\":12582912", "1e400", "$.segments[0].total_size"},
                        Case{"snapshot-end.json", "\"size\":20971520,\"stream\"", "1e400", "$.trace.events[0].size"},
                        Case{"trace.jsonl", "\"size\":20971520", "-1e400", "$.size"}}) {
    std::string text = data_text(c.fixture);
    const std::size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.fixture << ": " << c.from;
    const std::string key = c.from.substr(0, c.from.find(':') + 1);
    const std::size_t digits = std::min(c.from.find_first_not_of("0123456789", key.size()), c.from.size());
    text.replace(at + key.size(), digits - key.size(), c.number);  // the value after the key
    TempDir dir;
    expect_bad_input(run({"summary", dir.write(c.fixture, text)}),
                     "byte " + std::to_string(at + key.size()) + ": " + c.path + ": the number " + c.number +
                         " is too large for a 64-bit floating-point value (at most about 1.8e308); sizes, counts and "
                         "times are integers of at most 18446744073709551615\n");
  }
}

// A whole number written 1.0 where an integer is expected is quoted as written, not as the
// integer "1" the message asks for.
TEST(BadInput, AWholeNumberWrittenWithAFractionIsQuotedAsWritten) {
  TempDir dir;
  std::string text = data_text("snapshot-end.json");
  const std::string version = "\"schema_version\":1,";
  ASSERT_NE(text.find(version), std::string::npos);
  text.replace(text.find(version), version.size(), "\"schema_version\":1.0,");
  expect_bad_input(run({"summary", dir.write("s.json", text)}),
                   "$.schema_version: expected an integer, found 1.0, a whole number written with a fraction or an "
                   "exponent; write it as the integer 1\n");
  const std::string sized =
      trace_text({R"({"action":"alloc","time_us":2,"address":8192,"size":2.5e3,"stream":0,"tag":1})",
                  R"({"action":"alloc","time_us":3,"address":16384,"size":2.5,"stream":0,"tag":1})"});
  expect_bad_input(run({"memory", dir.write("t.jsonl", sized)}),
                   "$.size: expected a non-negative integer, found 2500.0, a whole number written with a fraction or "
                   "an exponent; write it as the integer 2500\n");
  std::string fraction = sized;
  fraction.replace(fraction.find("2.5e3"), 5, "2500");
  expect_bad_input(run({"memory", dir.write("f.jsonl", fraction)}),
                   "$.size: expected a non-negative integer, found 2.5\n");
}

TEST(BadInput, LiveBytesOverflowingIsReportedNotWrapped) {
  TempDir dir;
  const std::string first = event("alloc", 1, 4096, 9223372036854775808ull, 1);
  const std::string text = trace_text({first, event("alloc", 2, 8192, 9223372036854775808ull, 1)});
  const std::size_t offset = trace_text({}).size() + first.size() + 1;
  expect_bad_input(run({"memory", dir.write("t.jsonl", text)}),
                   "line 3 (byte " + std::to_string(offset) +
                       "): event 2: $.size: live bytes overflow 64 bits with this allocation of 9223372036854775808 "
                       "bytes");
}

TEST(BadInput, EventsOutOfTimeOrderNameTheLine) {
  const std::vector<std::string> events = {event("alloc", 10, 4096, 512, 1), event("alloc", 5, 8192, 512, 1)};
  expect_trace_refused("summary", events, "line 3 (byte");
  expect_trace_refused("summary", events, "out of time order (5 after 10)");
}

TEST(BadInput, TagIndexOutOfRangeIsRefused) {
  expect_trace_refused("memory", {event("alloc", 10, 4096, 512, 9)},
                       "$.tag: index 9 is out of range; `tags` has 3 entries");
}

TEST(BadInput, TraceShorterThanItsHeaderDeclaresIsTruncated) {
  TempDir dir;
  const std::string text = trace_text({event("alloc", 10, 4096, 512, 1)}, "5");
  expect_bad_input(run({"summary", dir.write("t.jsonl", text)}),
                   "declares 5 events but the file holds 1 (truncated file?)");
}

TEST(BadInput, TraceCutInsideTheLastLineIsASyntaxError) {
  TempDir dir;
  std::string text = trace_text({event("alloc", 10, 4096, 512, 1), event("free_requested", 11, 4096, 512, 1)});
  text.resize(text.size() - 9);
  expect_bad_input(run({"summary", dir.write("t.jsonl", text)}), "line 3 (byte");
}

TEST(BadInput, UnknownActionIsNamed) {
  expect_trace_refused("trace", {event("teleport", 10, 4096, 512, 1)}, "$.action: unknown action 'teleport'");
}

TEST(BadInput, WrongKindForTheSubcommandIsRefused) {
  TempDir dir;
  // A snapshot renderer never sees a trace: the kind picks the renderer, and a snapshot
  // claimed by a multi-line file is refused.
  const std::string lying = R"({"kind":"snapshot","schema_version":1})"
                            "\n" +
                            event("alloc", 1, 1, 1, 0) + "\n";
  expect_bad_input(run({"segments", dir.write("lying.json", lying)}),
                   "lying.json: line 2 (byte 39): a snapshot dump is one JSON document, but this file has more lines "
                   "after its first (is it a trace written with the wrong kind?)");
}

TEST(BadInput, DeepNestingIsRefusedWithoutCrashing) {
  TempDir dir;
  const std::string text = "{\"kind\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  const CliResult r = run({"summary", dir.write("deep.json", text)});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("nesting deeper than"), std::string::npos) << r.err;
}

TEST(BadInput, PickleGivenToSummaryPointsToImport) {
  TempDir dir;
  expect_bad_input(run({"summary", dir.write("s.pickle", std::string("\x80\x04\x95", 3))}), "remat-report import");
}

TEST(Usage, UnknownOptionExitsOne) {
  const CliResult r = run({"memory", "x.json", "--frobnicate"});
  EXPECT_EQ(r.code, 1);
}

TEST(Usage, TimelineNeedsAnSvgOrHtmlName) {
  TempDir dir;
  const std::string path = dir.write("t.jsonl", trace_text({event("alloc", 10, 4096, 512, 1)}));
  const CliResult r = run({"timeline", path, "-o", dir.path("out.png")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("name the output .svg"), std::string::npos) << r.err;
}

TEST(Usage, BadTimeUnitExitsOne) {
  TempDir dir;
  const std::string path = dir.write("t.jsonl", trace_text({event("alloc", 10, 4096, 512, 1)}));
  const CliResult r = run({"trace", path, "--from", "3 fortnights"});
  EXPECT_EQ(r.code, 1);
}

TEST(BadInput, SchemaCountsAHugeWholeNumberAsAnIntegerWithoutConvertingIt) {
  TempDir dir;
  // 1.4e139 has no fraction, so JSON Schema counts it an integer; the check converted it to a
  // 64-bit integer on the way (undefined behaviour, found by fuzzing). 1.5 is not an integer.
  const std::string head = R"({"kind":"snapshot","schema_version":1,"producer":"p","created_at":"c","host":"h",)";
  const auto whole = run({"validate", dir.write("whole.json", head + R"("pid":1.39638e139})")});
  EXPECT_EQ(whole.code, 2);
  EXPECT_NE(whole.err.find("$.rank: missing required field"), std::string::npos) << whole.err;
  EXPECT_EQ(whole.err.find("$.pid"), std::string::npos) << whole.err;
  const auto fraction = run({"validate", dir.write("fraction.json", head + R"("pid":1.5})")});
  EXPECT_NE(fraction.err.find("$.pid: expected integer, found a number with a fraction"), std::string::npos)
      << fraction.err;
}

// A snapshot's segments and trace events are read as they stream in; a bad value among them is
// refused with its path, the same through `ranks` (which lists the unreadable dump and goes on,
// or with --strict exits 2) as through `summary`.
TEST(BadInput, AStreamedSnapshotValueNamesItsPathInEveryCommand) {
  struct Case {
    std::string from, to, path;
  };
  for (const Case& c : {Case{"\"allocated_size\":12582912", "\"allocated_size\":0.5", "$.segments[0].allocated_size"},
                        Case{"\"size\":20971520,\"stream\"", "\"size\":-1,\"stream\"", "$.trace.events[0].size"}}) {
    std::string text = data_text("snapshot-end.json");
    const std::size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    text.replace(at, c.from.size(), c.to);
    TempDir dir;
    const std::string file = dir.write("rank0.json", text);
    expect_bad_input(run({"summary", file}), c.path);
    for (const bool strict : {false, true}) {
      // The only dump given is unreadable: `ranks` fails naming it and the path, --strict or not.
      const CliResult listed = strict ? run({"ranks", file, "--strict"}) : run({"ranks", file});
      EXPECT_EQ(listed.code, 2) << listed.err;
      EXPECT_NE(listed.err.find("no rank's dump could be read: " + file + ": " + c.path), std::string::npos)
          << listed.out << listed.err;
    }
  }
}

// A single-document dump cut short (a job killed mid-write) says so, with the byte and the JSON
// path it ends in, as a trace cut short does; the parser's own words are kept for other errors.
TEST(BadInput, ADocumentCutShortSaysSoWithTheByteAndPath) {
  TempDir dir;
  const std::string snapshot = data_text("snapshot-peak.json").substr(0, 5000);
  const std::string file = dir.write("cut.json", snapshot);
  for (const char* command : {"memory", "summary", "segments", "timeline"}) {
    const CliResult r =
        std::string(command) == "timeline" ? run({command, file, "-o", dir.path("t.svg")}) : run({command, file});
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_EQ(r.err.rfind("remat-report: " + file + ": byte 5000: the input ends inside $.", 0), 0u)
        << command << ": " << r.err;
    EXPECT_NE(r.err.find(": the file is cut short (a job killed mid-write?)\n"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("syntax error"), std::string::npos) << r.err;
  }
  const std::string oom = data_text("oom.json");
  const std::string cut_oom = dir.write("oom-cut.json", oom.substr(0, oom.size() / 2));
  const CliResult r = run({"oom", cut_oom});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(fmt::format("byte {}: the input ends inside $", oom.size() / 2)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the file is cut short"), std::string::npos) << r.err;
  const std::string profile = data_text("region-profile.json");
  const CliResult advise = run({"advise", dir.write("profile-cut.json", profile.substr(0, 300))});
  EXPECT_EQ(advise.code, 2);
  EXPECT_NE(advise.err.find("byte 300: the input ends inside $.regions[0]"), std::string::npos) << advise.err;
  // A syntax error before the end is no truncation.
  const std::string broken = dir.write("broken.json", "{\"kind\": \"snapshot\",, \"schema_version\": 1}");
  const CliResult syntax = run({"memory", broken});
  EXPECT_EQ(syntax.code, 2);
  EXPECT_EQ(syntax.err.find("cut short"), std::string::npos) << syntax.err;
}

}  // namespace
}  // namespace remat::report::testing
