// `remat-report schedule` and `remat-report plan`: PyTorch's CSV out and back in, plans as
// text and as pipeline-plan dumps that `validate` accepts, and bad input refused with exit 2.
#include "cli_runner.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace remat::report::testing {
namespace {

const char* const kSchedules[] = {
    "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev"};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
    begin = end + 1;
  }
  return lines;
}

TEST(ScheduleCommand, PrintsOneCsvRowPerRankInPyTorchsForm) {
  const CliResult r = run({"schedule", "--schedule", "1f1b", "--ranks", "3", "--microbatches", "4"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, data_text("pipeline-1f1b-3x4.csv"));  // written by PyTorch's csv.writer, "\r\n" rows
}

TEST(ScheduleCommand, LoweredAddsSendsAndRecvsInEitherOfPyTorchsOrders) {
  const CliResult r = run({"schedule", "--schedule", "1f1b", "--ranks", "3", "--microbatches", "4", "--lowered"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> rows = lines_of(r.out);
  ASSERT_EQ(rows.size(), 3u);
  // _add_send_recv over the timeline: idle steps take their turn, so receives come just in time.
  EXPECT_EQ(rows[2],
            "2RECV_F0,2F0,2B0,2SEND_B0,2RECV_F1,2F1,2B1,2SEND_B1,2RECV_F2,2F2,2B2,2SEND_B2,2RECV_F3,2F3,2B3,2SEND_B3");
  const CliResult runtime = run(
      {"schedule", "--schedule", "1f1b", "--ranks", "3", "--microbatches", "4", "--lowered", "--lowering", "runtime"});
  ASSERT_EQ(runtime.code, 0) << runtime.err;
  rows = lines_of(runtime.out);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2],
            "2UNSHARD,2RECV_F0,2F0,2RECV_F1,2B0,2SEND_B0,2F1,2RECV_F2,2B1,2SEND_B1,2F2,2RECV_F3,2B2,2SEND_B2,2F3,2B3,"
            "2SEND_B3,2REDUCE_GRAD,2RESHARD");
}

TEST(ScheduleCommand, ACsvPrintsBackAsItWasWrittenInBothForms) {
  TempDir dir;
  const CliResult compute = run({"schedule", "--csv", data_path("pipeline-1f1b-3x4.csv")});
  ASSERT_EQ(compute.code, 0) << compute.err;
  EXPECT_EQ(compute.out, data_text("pipeline-1f1b-3x4.csv"));
  const CliResult lowered = run({"schedule", "--schedule", "interleaved-1f1b", "--ranks", "2", "--virtual-stages", "2",
                                 "--microbatches", "4", "--lowered"});
  ASSERT_EQ(lowered.code, 0) << lowered.err;
  const std::string file = dir.write("lowered.csv", lowered.out);
  const CliResult again = run({"schedule", "--csv", file, "--format", "compute_comms", "--lowered"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(again.out, lowered.out);
  // Without --lowered, a compute_comms file prints its compute actions.
  const CliResult stripped = run({"schedule", "--csv", file, "--format", "compute_comms"});
  ASSERT_EQ(stripped.code, 0) << stripped.err;
  EXPECT_FALSE(contains(stripped.out, "RECV"));
  EXPECT_TRUE(contains(stripped.out, "0F0"));
}

TEST(PlanCommand, OneFOneBWithoutSlackIsFlaggedUnsafeWithTheSafeSize) {
  // In the runtime's order stage s >= 1 holds S - s + 1 forward inputs, one more than NeMo's S - s.
  const CliResult r = run({"plan", "--schedule", "1f1b", "--ranks", "3", "--microbatches", "4", "--slack", "0",
                           "--buffer-bytes", "64MiB", "--lowering", "runtime"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out,
                       "1f1b: 3 ranks, 3 stages, 4 microbatches; runtime lowering; NeMo's closed form with "
                       "slack 0; 64.00 MiB per buffer set"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "unsafe: rank 1, stage 1 F: NeMo's ring of 2 is smaller than the 3 buffers live at once"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "total: stock 16 sets (1.00 GiB), pooled 10 sets (640.00 MiB): 6 fewer (37.5%)"))
      << r.out;
}

TEST(PlanCommand, InTheTimelinesOrderNemosRingWithoutSlackIsSafe) {
  const CliResult r = run({"plan", "--schedule", "1f1b", "--ranks", "8", "--microbatches", "64", "--slack", "0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "add-send-recv lowering")) << r.out;
  EXPECT_FALSE(contains(r.out, "UNSAFE")) << r.out;
  EXPECT_TRUE(contains(r.out, "total: stock 896 sets, pooled 64 sets: 832 fewer (92.9%)")) << r.out;
}

TEST(PlanCommand, ACustomCsvGetsTheColoredMinimumOnly) {
  const CliResult r = run({"plan", "--csv", data_path("pipeline-1f1b-3x4.csv")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(
      r.out,
      "custom schedule: 3 ranks, 3 stages, 4 microbatches; add-send-recv lowering; rings of the colored minimum"));
  EXPECT_FALSE(contains(r.out, "safe"));
}

TEST(PlanCommand, OneRankOneMicrobatchIsCountedInTheSingular) {
  const CliResult r = run({"plan", "--schedule", "1f1b", "--ranks", "1", "--microbatches", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "1f1b: 1 rank, 1 stage, 1 microbatch; ")) << r.out;
}

TEST(PlanCommand, GPipeSaysThePoolSavesNothingOnActivations) {
  const CliResult r = run({"plan", "--schedule", "gpipe", "--ranks", "4", "--microbatches", "8"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "the pool saves nothing on activations (F)")) << r.out;
}

TEST(PlanCommand, EveryScheduleWritesAPipelinePlanDumpThatValidates) {
  TempDir dir;
  for (const char* schedule : kSchedules) {
    for (const char* lowering : {"add-send-recv", "runtime"}) {
      const CliResult r = run(
          {"plan", "--schedule", schedule, "--ranks", "4", "--microbatches", "8", "--json", "--lowering", lowering});
      ASSERT_EQ(r.code, 0) << schedule << ": " << r.err;
      const nlohmann::json plan = nlohmann::json::parse(r.out);
      EXPECT_EQ(plan["kind"], "pipeline-plan");
      EXPECT_EQ(plan["schedule"], schedule);
      EXPECT_EQ(plan["lowering"], lowering);
      const int stages = plan["stages"].get<int>();
      ASSERT_EQ(plan["entries"].size(), static_cast<std::size_t>(2 * stages)) << schedule;
      for (const auto& entry : plan["entries"]) {
        ASSERT_EQ(entry["slots"].size(), 8u);
        EXPECT_EQ(entry["ring_size"].is_null(), entry["received"] == 0) << schedule;
      }
      const std::string file = dir.write(std::string(schedule) + "-" + lowering + ".json", r.out);
      const CliResult valid = run({"validate", file});
      EXPECT_EQ(valid.code, 0) << schedule << ": " << valid.err;
      EXPECT_TRUE(contains(valid.out, "valid pipeline-plan dump (schema_version 1, pipeline-plan.schema.json)"))
          << valid.out;
    }
  }
}

TEST(PlanCommand, TheSchemaRefusesABrokenPlan) {
  TempDir dir;
  const CliResult r = run({"plan", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json plan = nlohmann::json::parse(r.out);
  plan["entries"][1]["direction"] = "X";
  plan["entries"][2].erase("slots");
  const CliResult invalid = run({"validate", dir.write("broken.json", plan.dump())});
  EXPECT_EQ(invalid.code, 2);
  EXPECT_TRUE(contains(invalid.err, "$.entries[1].direction")) << invalid.err;
  EXPECT_TRUE(contains(invalid.err, "$.entries[2]")) << invalid.err;
}

TEST(PipelineCommands, ValidateReadsStageProfilesAndPredictionsAsPredictDoes) {
  // A whole number written with a fraction passes the schema; `predict` refuses it, and so does
  // validate now (before: "valid stage-profile dump").
  TempDir dir;
  nlohmann::json profile = nlohmann::json::parse(data_text("stage-profile-0.json"));
  profile["bytes"]["params"] = 655360.0;
  const std::string file = dir.write("fraction.json", profile.dump());
  CliResult r = run({"validate", file});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.err.find("$.bytes.params: must be a whole number"), std::string::npos) << r.err;
  for (const char* valid : {"stage-profile-0.json", "pipeline-prediction.json"}) {
    r = run({"validate", data_path(valid)});
    EXPECT_EQ(r.code, 0) << valid << ": " << r.err;
  }
}

TEST(PlanCommand, ValidateRefusesAPlanWhoseIndicesLeaveItsRanksStagesOrRings) {
  // (Before, each of these was a "valid pipeline-plan dump".)
  const nlohmann::json plan = nlohmann::json::parse(data_text("pipeline-plan.json"));
  ASSERT_EQ(plan["entries"][1]["ring_size"], 3);
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& p) { p["entries"][1]["rank"] = 99; },
       "$.entries[1].rank: 99 is not one of the plan's 3 ranks"},
      {[](nlohmann::json& p) { p["entries"][1]["stage"] = 3; },
       "$.entries[1].stage: 3 is not one of the plan's 3 stages"},
      {[](nlohmann::json& p) { p["entries"][1]["slots"][2] = 3; },
       "$.entries[1].slots[2]: slot 3 is outside the entry's ring of 3"},
      {[](nlohmann::json& p) { p["entries"][1]["slots"] = {0}; },
       "$.entries[1].slots: 1 slots for the plan's 4 microbatches (one each)"},
      {[](nlohmann::json& p) { p["ranks"] = 3.0; },
       "$.ranks: must be a whole number of 0 or more written without a fraction or exponent"}};
  TempDir dir;
  for (const auto& [edit, message] : cases) {
    nlohmann::json broken = plan;
    edit(broken);
    const std::string file = dir.write("broken.json", broken.dump());
    const CliResult r = run({"validate", file});
    EXPECT_EQ(r.code, 2) << message;
    EXPECT_EQ(r.err, "invalid: " + file + ": " + message + "\n");
  }
}

// Bad option values are usage errors, as in every other command: exit 1, the command named.
TEST(PipelineCommands, BadOptionValuesExitOneNamingTheCommand) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"schedule", "--schedule", "zigzag", "--ranks", "4", "--microbatches", "8"},
       "--schedule: unknown schedule 'zigzag'; the schedules are gpipe, 1f1b, interleaved-1f1b, looped-bfs, "
       "interleaved-zero-bubble, zbv-zero-bubble, dualpipev"},
      {{"plan", "--schedule", "1f1b", "--ranks", "0", "--microbatches", "8"},
       "--ranks: got '0'; give a whole number from 1 to 65536 (pipeline ranks)"},
      {{"plan", "--schedule", "1f1b", "--ranks", "-3", "--microbatches", "8"},
       "--ranks: got '-3'; give a whole number from 1 to 65536 (pipeline ranks)"},
      {{"schedule", "--schedule", "gpipe", "--ranks", "four", "--microbatches", "8"},
       "--ranks: got 'four'; give a whole number from 1 to 65536 (pipeline ranks)"},
      {{"plan", "--schedule", "gpipe", "--ranks", "4", "--microbatches", "0"},
       "--microbatches: got '0'; give a whole number from 1 to 1048576 (microbatches per step)"},
      {{"plan", "--schedule", "looped-bfs", "--ranks", "4", "--virtual-stages", "0", "--microbatches", "8"},
       "--virtual-stages: got '0'; give a whole number from 1 to 65536 (stages per rank)"},
      {{"plan", "--schedule", "1f1b", "--ranks", "4", "--microbatches", "8", "--slack", "-1"},
       "--slack: got '-1'; give a whole number from 0 to 1048576 (extra buffer sets beyond the in-flight depth)"},
  };
  for (const Case& c : cases) {
    const CliResult r = run(c.args);
    EXPECT_EQ(r.code, 1) << c.args[0] << " " << r.err;
    EXPECT_EQ(r.err, "remat-report " + c.args[0] + ": " + c.message + "\n");
  }
  // Messages from the schedule library about the shape the options give: the parameter and value.
  const CliResult v =
      run({"plan", "--schedule", "zbv-zero-bubble", "--ranks", "4", "--virtual-stages", "3", "--microbatches", "8"});
  EXPECT_EQ(v.code, 1);
  EXPECT_TRUE(contains(v.err, "remat-report plan: --schedule zbv-zero-bubble: ") && contains(v.err, "3")) << v.err;
  const CliResult few = run({"schedule", "--schedule", "1f1b", "--ranks", "4", "--microbatches", "2"});
  EXPECT_EQ(few.code, 1);
  EXPECT_TRUE(contains(few.err, "remat-report schedule: --schedule 1f1b: ") && contains(few.err, "2")) << few.err;
  const CliResult zero = run({"predict", data_path("stage-profile-0.json"), data_path("stage-profile-1.json"),
                              "--schedule", "1f1b", "--ranks", "2", "--microbatches", "0"});
  EXPECT_EQ(zero.code, 1);
  EXPECT_EQ(zero.err, "remat-report predict: --microbatches: got 0; a step runs 1 or more microbatches\n");
  for (const char* bytes : {"0", "12XB", "lots", "99999999999TiB"}) {
    const CliResult r =
        run({"plan", "--schedule", "1f1b", "--ranks", "4", "--microbatches", "8", "--buffer-bytes", bytes});
    EXPECT_EQ(r.code, 1) << bytes;
    EXPECT_TRUE(contains(r.err, std::string("remat-report plan: --buffer-bytes '") + bytes + "': ")) << r.err;
  }
}

TEST(PipelineCommands, BadInputExitsTwoNamingTheProblem) {
  TempDir dir;
  const std::string malformed = dir.write("bad.csv", "0F0,0X1\r\n1F0\r\n");
  const CliResult bad_csv = run({"plan", "--csv", malformed});
  EXPECT_EQ(bad_csv.code, 2);
  EXPECT_TRUE(contains(bad_csv.err, malformed) && contains(bad_csv.err, "0X1")) << bad_csv.err;
  const CliResult missing = run({"schedule", "--csv", dir.path("absent.csv")});
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "cannot read " + dir.path("absent.csv") + ": No such file")) << missing.err;
}

TEST(PipelineCommands, ADirectoryAsTheCsvIsBadInputNotACrash) {
  // Reading a directory through a file stream throws from inside the stream buffer.
  TempDir dir;
  for (const char* command : {"schedule", "plan"}) {
    const CliResult r = run({command, "--csv", dir.path("")});
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "is a directory; pass a schedule CSV")) << r.err;
  }
}

TEST(PipelineCommands, BufferBytesPastSixtyFourBitsOrNotASizeAreRefused) {
  auto plan_with = [](const std::string& bytes) {
    return run({"plan", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--buffer-bytes", bytes});
  };
  for (const char* bytes : {"18446744073709551616", "99999999999999999999999", "17179869184GiB", "16777216TiB"}) {
    const CliResult r = plan_with(bytes);
    EXPECT_EQ(r.code, 1) << bytes;
    EXPECT_TRUE(contains(r.err, std::string("--buffer-bytes '") + bytes + "': more than 2^64 - 1 bytes")) << r.err;
  }
  for (const char* bytes : {"1e3", "-5", "16EiB", "0.5B"}) {
    const CliResult r = plan_with(bytes);
    EXPECT_EQ(r.code, 1) << "'" << bytes << "'";
    EXPECT_TRUE(contains(r.err, std::string("--buffer-bytes '") + bytes + "': ")) << r.err;
  }
  for (const char* bytes : {"64 MiB", " 1", "64MiB ", "1.5GiB", "64MB"}) EXPECT_EQ(plan_with(bytes).code, 0) << bytes;
  EXPECT_EQ(plan_with("18446744073709551615").code, 2);  // fits, but two sets of it do not
}

TEST(PipelineCommands, OptionsThatDoNotGoTogetherAreUsageErrors) {
  const CliResult neither = run({"plan", "--ranks", "4"});
  EXPECT_EQ(neither.code, 1);
  EXPECT_EQ(neither.err, "remat-report plan: give --schedule NAME --ranks R --microbatches M, or --csv FILE\n");
  const CliResult both = run({"schedule", "--schedule", "1f1b", "--csv", data_path("pipeline-1f1b-3x4.csv")});
  EXPECT_EQ(both.code, 1);
  EXPECT_EQ(both.err, "remat-report schedule: give --schedule or --csv, not both\n");
  const CliResult counts = run({"plan", "--csv", data_path("pipeline-1f1b-3x4.csv"), "--ranks", "3"});
  EXPECT_EQ(counts.code, 1);
  EXPECT_TRUE(contains(counts.err, "--ranks applies to --schedule only")) << counts.err;
  const CliResult lowered_twice =
      run({"plan", "--csv", data_path("pipeline-1f1b-3x4.csv"), "--format", "compute_comms", "--lowering", "runtime"});
  EXPECT_EQ(lowered_twice.code, 1);
  EXPECT_TRUE(contains(lowered_twice.err, "a compute_comms file is lowered already")) << lowered_twice.err;
  const CliResult no_ranks = run({"schedule", "--schedule", "1f1b", "--microbatches", "8"});
  EXPECT_EQ(no_ranks.code, 1);
  EXPECT_TRUE(contains(no_ranks.err, "--schedule needs --ranks R and --microbatches M")) << no_ranks.err;
}


// A rank whose snapshot peaks at 0 B was measured: the table shows 0 B, as --json's measured_bytes 0
// says, and "-" only for a rank the job wrote no dump for; the error of a 0 B peak has none.
TEST(RanksPredicted, ARankMeasuredAtZeroBytesShowsZeroNotMissing) {
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  dir.write("snapshot-rank0.json", snapshot.dump());
  const auto zero_numbers = [](auto& self, nlohmann::json& value) -> void {
    if (value.is_number()) value = 0;
    if (!value.is_structured()) return;
    for (auto& member : value) self(self, member);
  };
  snapshot["rank"] = 1;
  snapshot["segments"] = nlohmann::json::array();
  snapshot["trace"]["events"] = nlohmann::json::array();
  zero_numbers(zero_numbers, snapshot["stats"]);
  for (auto& tag : snapshot["tag_stats"]) {
    for (auto& [key, figures] : tag.items()) {
      if (key != "tag") zero_numbers(zero_numbers, figures);
    }
  }
  dir.write("snapshot-rank1.json", snapshot.dump());
  const std::string dir_path = std::filesystem::path(dir.path("snapshot-rank0.json")).parent_path().string();
  const std::string prediction = data_path("pipeline-prediction.json");

  const CliResult json = run({"ranks", dir_path, "--predicted", prediction, "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const nlohmann::json rows = nlohmann::json::parse(json.out)["ranks"];
  ASSERT_EQ(rows.size(), 2u) << json.out;
  EXPECT_EQ(rows[1]["measured_bytes"], 0) << json.out;
  EXPECT_TRUE(rows[1]["error"].is_null()) << json.out;

  const CliResult table = run({"ranks", dir_path, "--predicted", prediction});
  ASSERT_EQ(table.code, 0) << table.err;
  const std::vector<std::string> lines = lines_of(table.out);
  ASSERT_GE(lines.size(), 4u) << table.out;
  EXPECT_EQ(lines[3], "   1        0 B   3.33 MiB       -  1B3") << table.out;

  // Without rank 1's dump the same row shows it missing.
  std::filesystem::remove(dir.path("snapshot-rank1.json"));
  const CliResult missing = run({"ranks", dir_path, "--predicted", prediction});
  ASSERT_EQ(missing.code, 0) << missing.err;
  EXPECT_EQ(lines_of(missing.out)[3], "   1          -   3.33 MiB       -  1B3") << missing.out;
}

}  // namespace
}  // namespace remat::report::testing
