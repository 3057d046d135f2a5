// Usage and wrong-input messages name the command, the value or file, and what would work.
#include "cli_runner.hpp"

#include <filesystem>

#include <string>
#include <utility>
#include <vector>

namespace remat::report::testing {
namespace {

const std::string kSubcommands =
    "summary, memory, segments, trace, timeline, diff, validate, export, import, oom, schedule, plan, whatif, advise, ranks, predict";

TEST(CliMessages, NumbersOutOfRangeNameTheOptionTheValueAndTheRange) {
  TempDir dir;
  const std::string trace = dir.write("t.jsonl", trace_text({event("alloc", 1, 4096, 512, 1)}));
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"trace", trace, "--limit", "-1"},
       "remat-report trace: --limit: got '-1'; give a whole number, 1 or more (events to print at most)"},
      {{"trace", trace, "--limit", "0"},
       "remat-report trace: --limit: got '0'; give a whole number, 1 or more (events to print at most)"},
      {{"memory", trace, "--top", "2.5"},
       "remat-report memory: --top: got '2.5'; give a whole number, 1 or more (groups to show)"},
      {{"diff", trace, trace, "--top", "-3"},
       "remat-report diff: --top: got '-3'; give a whole number, 1 or more (changes to show)"},
      {{"segments", trace, "--width", "401"},
       "remat-report segments: --width: got '401'; give a whole number from 0 to 400 (characters in each segment's "
       "picture)"},
      {{"timeline", trace, "-o", dir.path("t.svg"), "--buckets", "1"},
       "remat-report timeline: --buckets: got '1'; give a whole number from 2 to 1000000 (time buckets)"},
      {{"timeline", trace, "-o", dir.path("t.svg"), "--series", "many"},
       "remat-report timeline: --series: got 'many'; give a whole number from 1 to 200 (series drawn on their own)"},
      {{"validate", trace, "--max-errors", "0"},
       "remat-report validate: --max-errors: got '0'; give a whole number from 1 to 100000 (problems to report at "
       "most)"},
      {{"import", trace, "-o", dir.path("o.json"), "--device", "-2"},
       "remat-report import: --device: got '-2'; give a whole number from 0 to 2147483647 (a CUDA device index)"},
  };
  for (const Case& c : cases) {
    const CliResult r = run(c.args);
    EXPECT_EQ(r.code, 1) << c.args[0];
    EXPECT_EQ(r.err, c.message + "\nRun with --help for more information.\n");
  }
}

TEST(CliMessages, TimeWindowsMustBeNonNegativeAndInOrder) {
  TempDir dir;
  const std::string trace = dir.write("t.jsonl", trace_text({event("alloc", 1, 4096, 512, 1)}));
  CliResult r = run({"trace", trace, "--from", "20us", "--to", "10us"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "remat-report trace: --from 20us is after --to 10us; no event could print: give --from a time at or "
            "before --to\n");
  r = run({"trace", trace, "--from", "-5ms"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "remat-report trace: --from -5ms: times count from the dump's first event and cannot be negative; give 0 "
            "or more, such as 1500, 1500us, 2.5ms or 3s\n");
}

TEST(CliMessages, AnUnknownSubcommandIsNamedWithTheListAndTheNearestOne) {
  CliResult r = run({"frobnicate", "x.json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "remat-report: unknown subcommand 'frobnicate'; the subcommands are: " + kSubcommands +
                       "; run `remat-report --help` for what each does\n");
  r = run({"sumary", "x.json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "remat-report: unknown subcommand 'sumary' (did you mean `summary`?); the subcommands are: " +
                       kSubcommands + "; run `remat-report --help` for what each does\n");
  r = run({"--json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "remat-report: a subcommand is required: " + kSubcommands +
                       "; run `remat-report --help` for what each does\n");
}

TEST(CliMessages, AKindWithoutTheViewNamesTheCommandTheFileAndWhatReadsIt) {
  TempDir dir;
  struct Case {
    std::vector<std::string> args;
    std::string file, message;
  };
  const std::string oom = data_path("oom.json"), saved = data_path("saved-report.json");
  const std::string remat = data_path("remat-trace.json"), report = data_path("memory-report.json");
  const std::string trace = data_path("trace.jsonl");
  const Case cases[] = {
      {{"diff", oom, data_path("snapshot-end.json")},
       oom,
       "`remat-report diff` reads dumps with live bytes by group (kind snapshot, trace or memory-report); this is an "
       "oom dump: `remat-report oom " +
           oom + "` reads it"},
      {{"timeline", saved, "-o", dir.path("t.svg")},
       saved,
       "`remat-report timeline` reads dumps with allocator events (kind snapshot or trace); this is a saved-report "
       "dump: `remat-report summary " +
           saved + "` reads it"},
      {{"trace", remat},
       remat,
       "`remat-report trace` reads dumps with allocator events (kind snapshot or trace); this is a remat-trace dump: "
       "`remat-report summary " +
           remat + "` reads it"},
      {{"segments", report},
       report,
       "`remat-report segments` reads dumps with segments (kind snapshot or trace); this is a memory-report dump: "
       "`remat-report summary " +
           report + "` reads it"},
      {{"export", oom, "--to", "torch-snapshot", "-o", dir.path("o.pickle")},
       oom,
       "`remat-report export` reads dumps with segments and events (kind snapshot or trace); this is an oom dump: "
       "`remat-report oom " +
           oom + "` reads it"},
      {{"oom", trace},
       trace,
       "`remat-report oom` reads OOM reports, which the allocator writes as oom-*.json when an allocation fails (kind "
       "oom); this is a trace dump: `remat-report summary " +
           trace + "` reads it"},
  };
  for (const Case& c : cases) {
    const CliResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args[0];
    EXPECT_EQ(r.err, "remat-report: " + c.file + ": " + c.message + "\n");
  }
}

TEST(CliMessages, AKindWithASchemaButNoRendererNamesWhatReadsIt) {
  const std::string plan = data_path("pipeline-plan.json");
  const CliResult r = run({"memory", plan});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: " + plan +
                       ": `remat-report memory` reads dumps with live bytes by group (kind snapshot, trace or "
                       "memory-report); this is a pipeline-plan dump: `remat-report summary " +
                       plan + "` reads it\n");
  const CliResult timeline = run({"timeline", plan, "-o", "never-written.svg"});
  EXPECT_EQ(timeline.code, 2);
  EXPECT_NE(timeline.err.find("this is a pipeline-plan dump: `remat-report summary"), std::string::npos)
      << timeline.err;
}

TEST(CliMessages, DiffReadsStandardInputForOneSideOnly) {
  const CliResult r = run({"diff", "-", "-"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "remat-report diff: BEFORE and AFTER are both `-`, but standard input holds one dump; save one of them "
            "to a file and pass its path\n");
}

// With expandable segments each stream reserves the device's size and an eighth more of the
// replay's 64-bit space; thousands of streams at a 4 PiB capacity exhaust it. That is said to be
// the replay's limit, not reported as the workload running out of memory.
TEST(CliMessages, WhatifSaysWhenTheReplaysOwnAddressSpaceRanOut) {
  TempDir dir;
  std::vector<std::string> events;
  for (int i = 0; i < 4000; ++i) events.push_back(event("alloc", 1000 + i, (1ULL << 40) + 4096ULL * i, 512, 0, i + 1));
  const std::string trace = dir.write("streams.jsonl", trace_text(events));
  const CliResult r = run({"whatif", trace, "--capacity", "4PiB", "--conf", "expandable_segments:True"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("note: conf 1 stopped at event 3641, not out of the device's memory: the replay's 64-bit "
                       "address space ran out"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("this is the replay's limit, not the workload's: give --capacity the device's real size"),
            std::string::npos)
      << r.out;
}

TEST(CliMessages, TheSubcommandListGivesEachSubcommandOneLineAndItsHelpTheManual) {
  const CliResult list = run({"--help"});
  ASSERT_EQ(list.code, 0);
  const std::size_t whatif = list.out.find("  whatif ");
  ASSERT_NE(whatif, std::string::npos) << list.out;
  const std::size_t next = list.out.find('\n', whatif);
  EXPECT_EQ(list.out.compare(next + 1, 9, "  advise "), 0) << list.out;  // the next line is the next subcommand
  const CliResult manual = run({"whatif", "--help"});
  EXPECT_NE(manual.out.find("Replay rules: alloc -> allocate"), std::string::npos) << manual.out;
}

TEST(CliMessages, AnEmptyPictureFileOrHostBudgetIsRefusedNotTakenAsLeftOut) {
  // (Before, each ran as if the option were left out: no picture, no host budget, exit 0.)
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"advise", data_path("region-profile.json"), "--budget", "2MiB", "--host-budget", ""},
       "remat-report advise: --host-budget: is empty; give host memory with a unit (64GiB), or 0 for none"},
      {{"ranks", data_path("snapshot-end.json"), "--svg", ""},
       "remat-report ranks: --svg: is empty; give the picture's file, OUT.svg"},
      {{"ranks", data_path("snapshot-end.json"), "--html", ""},
       "remat-report ranks: --html: is empty; give the page's file, OUT.html"},
      {{"predict", data_path("stage-profile-0.json"), "--svg", ""},
       "remat-report predict: --svg: is empty; give the picture's file, OUT.svg"}};
  for (const auto& [arguments, message] : cases) {
    const CliResult r = run(arguments);
    EXPECT_EQ(r.code, 1) << message;
    EXPECT_EQ(r.err.substr(0, r.err.find('\n')), message);
    EXPECT_EQ(r.out, "");
  }
}

// A command that cannot read a dump's kind points at the command that does, and `summary` of such
// a dump says the same, never "no renderer yet".
TEST(CliMessages, AWrongKindPointsAtTheCommandThatReadsIt) {
  struct Case {
    std::string fixture;
    std::string kind;
    std::string command;  // with the path, as the message writes it
  };
  const Case cases[] = {
      {"region-profile.json", "region-profile", "remat-report advise " + data_path("region-profile.json")},
      {"stage-profile-0.json", "stage-profile",
       "remat-report predict " + data_path("stage-profile-0.json") + " --schedule NAME --ranks R --microbatches M"},
      {"pipeline-prediction.json", "pipeline-prediction",
       "remat-report ranks RANK_DUMPS... --predicted " + data_path("pipeline-prediction.json")}};
  for (const Case& c : cases) {
    const CliResult memory = run({"memory", data_path(c.fixture)});
    EXPECT_EQ(memory.code, 2) << c.fixture;
    EXPECT_NE(memory.err.find("this is a " + c.kind + " dump: `" + c.command + "` reads it\n"), std::string::npos)
        << memory.err;
    const CliResult summary = run({"summary", data_path(c.fixture)});
    EXPECT_EQ(summary.code, 0) << summary.err;
    EXPECT_NE(summary.out.find("note: `" + c.command + "` reads this " + c.kind + " dump: "), std::string::npos)
        << summary.out;
    EXPECT_EQ(summary.out.find("no renderer"), std::string::npos) << summary.out;
  }
  // Dumps no command takes as input: summary says what writes them.
  const CliResult plan = run({"summary", data_path("pipeline-plan.json")});
  EXPECT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find("note: a pipeline-plan dump is what `remat-report plan --json` writes"), std::string::npos)
      << plan.out;
  EXPECT_EQ(plan.out.find("no renderer"), std::string::npos) << plan.out;
  const CliResult segments = run({"segments", data_path("pipeline-plan.json")});
  EXPECT_EQ(segments.code, 2);
  EXPECT_NE(segments.err.find("`remat-report summary " + data_path("pipeline-plan.json") + "` reads it"),
            std::string::npos)
      << segments.err;
}

// `ranks` with no dump it could read fails, naming each file and why, rather than reporting 0 ranks.
TEST(CliMessages, RanksFailsWhenNoDumpCouldBeRead) {
  TempDir dir;
  const std::string empty = dir.write("snapshot-rank1.json", "");
  const std::string cut = dir.write("snapshot-rank2.json", data_text("snapshot-peak.json").substr(0, 3000));
  const CliResult r = run({"ranks", empty, cut});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("remat-report: no rank's dump could be read: " + empty + ": file is empty (0 bytes)", 0), 0u)
      << r.err;
  EXPECT_NE(r.err.find("; " + cut + ": byte "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the file is cut short"), std::string::npos) << r.err;
}

// A folder whose dumps sit in subfolders says that subfolders are not searched, and names them.
TEST(CliMessages, RanksNamesTheSubfoldersItDoesNotSearch) {
  TempDir dir;
  std::filesystem::create_directories(dir.path("job/rank0"));
  std::filesystem::create_directories(dir.path("job/rank1"));
  dir.write("job/rank0/snapshot.json", data_text("snapshot-peak.json"));
  dir.write("job/rank1/snapshot.json", data_text("snapshot-peak.json"));
  const CliResult r = run({"ranks", dir.path("job")});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: no rank's snapshot or OOM dump in " + dir.path("job") +
                       ", and subfolders are not searched: pass the folders that hold the dumps (" +
                       dir.path("job/rank0") + ", " + dir.path("job/rank1") + ") or the dumps in them\n");
}

}  // namespace
}  // namespace remat::report::testing
