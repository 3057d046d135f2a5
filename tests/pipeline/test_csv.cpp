// PyTorch's pipeline CSV: written byte for byte as Python's csv.writer does, read as Python's
// csv.reader does (line endings, quoting, blank lines), every reference file loading back into
// the schedule it came from, and the inputs users really send: malformed actions, huge and
// negative numbers, empty files, byte-order marks, and lines of 100 MB.

#include <remat/pipeline/csv.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>

#include "reference_files.hpp"
#include "support/sanitized.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace remat::pipeline {
namespace {

using testing::cells_of;

std::string csv_of(const Schedule& schedule) {
  std::ostringstream out;
  write_csv(out, schedule);
  return out.str();
}

Schedule load(const std::string& text, CsvFormat format = CsvFormat::compute_only) {
  std::istringstream in(text);
  return load_csv(in, format, "test.csv");
}

std::string error_of(const std::string& text, CsvFormat format = CsvFormat::compute_only) {
  try {
    load(text, format);
  } catch (const PlanError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_MESSAGE(message, text) EXPECT_NE((message).find(text), std::string::npos) << (message)

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void expect_same(const Schedule& a, const Schedule& b, const std::string& label) {
  EXPECT_EQ(cells_of(a), cells_of(b)) << label;
  EXPECT_EQ(a.stage_to_rank, b.stage_to_rank) << label;
  EXPECT_EQ(a.microbatches, b.microbatches) << label;
}

const char* const kOneFOneB2x2 = "0F0,,,0F1,0B0,,0B1\r\n,1F0,1B0,1F1,1B1\r\n";

TEST(Csv, WritesCrLfAfterEachRowAndIdleStepsAsEmptyCells) {
  EXPECT_EQ(csv_of(generate_schedule(ScheduleKind::one_f_one_b, {2, std::nullopt, 2})), kOneFOneB2x2);
}

TEST(Csv, WritesARowOfOneIdleStepAsQuotesAndAnEmptyRankAsAnEmptyLine) {
  // Python's csv.writer quotes a lone empty field so that the row reads back; no rows are empty.
  Schedule s;
  s.ranks = {RankOrder{std::nullopt}, RankOrder{}, RankOrder{parse_action("0F0"), std::nullopt}};
  EXPECT_EQ(csv_of(s), "\"\"\r\n\r\n0F0,\r\n");
}

TEST(Csv, WritesOverlappedGroupsUnquoted) {
  Schedule s;
  s.ranks = {RankOrder{parse_action("(0F3;1B1)OVERLAP_F_B"), parse_action("0RECV_F1")}};
  EXPECT_EQ(csv_of(s), "(0F3;1B1)OVERLAP_F_B,0RECV_F1\r\n");
}

TEST(Csv, EveryReferenceFileLoadsBackIntoTheScheduleItCameFrom) {
  for (const auto& ref : testing::reference_shapes()) {
    const Schedule compute_only = generate_schedule(ref.kind, ref.shape);
    std::ifstream a(testing::reference_path(ref.compute_only), std::ios::binary);
    expect_same(load_csv(a, CsvFormat::compute_only, ref.compute_only), compute_only, ref.compute_only);
    std::ifstream b(testing::reference_path(ref.compute_comms), std::ios::binary);
    expect_same(load_csv(b, CsvFormat::compute_comms, ref.compute_comms), lower_schedule(compute_only),
                ref.compute_comms);
    std::ifstream c(testing::reference_path(ref.runtime), std::ios::binary);
    expect_same(load_csv(c, CsvFormat::compute_comms, ref.runtime), lower_schedule_for_runtime(compute_only),
                ref.runtime);
  }
}

TEST(Csv, PyTorchsOwnOneFOneBPipelineOrderIsRefusedForItsMisnumberedForwards) {
  // tests/pipeline/reference/1f1b_r4_v1_m6.pipeline_order.csv is Schedule1F1B.pipeline_order as
  // PyTorch 2.11 holds it: REDUCE_GRAD at the end of each row, last rank's forwards 3F1..3F6.
  std::ifstream in(testing::reference_path("1f1b_r4_v1_m6.pipeline_order.csv"), std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string without_reduce_grad;
  for (const std::string& line : testing::split(text, '\n')) {
    if (line.empty()) continue;
    without_reduce_grad += line.substr(0, line.rfind(',')) + "\n";
  }
  EXPECT_MESSAGE(error_of(text), "0REDUCE_GRAD: a compute_only schedule holds F, B, I, W and OVERLAP_F_B only");
  EXPECT_MESSAGE(error_of(without_reduce_grad), "rank 0: stage 0 never runs 0F6");
}

TEST(Csv, RoundTripsEverySchedulesBothForms) {
  for (const ScheduleKind kind : all_schedule_kinds()) {
    const Schedule s = generate_schedule(kind, {4, std::nullopt, 8});
    expect_same(load(csv_of(s)), s, std::string(to_string(kind)));
    const Schedule lowered = lower_schedule(s);
    expect_same(load(csv_of(lowered), CsvFormat::compute_comms), lowered, std::string(to_string(kind)));
  }
}

TEST(Csv, InfersStageToRankAndMicrobatchCountFromTheActions) {
  const Schedule v = load(csv_of(generate_schedule(ScheduleKind::dualpipev, {2, std::nullopt, 4})));
  EXPECT_EQ(v.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(v.microbatches, 4);
}

TEST(Csv, ReadsLfCrAndCrLfLineEndingsAndAMissingFinalNewlineAlike) {
  const Schedule expected = load(kOneFOneB2x2);
  for (const std::string text :
       {"0F0,,,0F1,0B0,,0B1\n,1F0,1B0,1F1,1B1\n", "0F0,,,0F1,0B0,,0B1\r,1F0,1B0,1F1,1B1\r",
        "0F0,,,0F1,0B0,,0B1\r\n,1F0,1B0,1F1,1B1", "0F0,,,0F1,0B0,,0B1\n,1F0,1B0,1F1,1B1\r\n"}) {
    expect_same(load(text), expected, text);
  }
}

TEST(Csv, ReadsQuotedCellsAndSpacesAroundActionsAsPythonAndPyTorchDo) {
  const Schedule expected = load(kOneFOneB2x2);
  expect_same(load("\"0F0\",,\"\",0F1, 0B0 ,,\"0B1\"\r\n,1F0,\"1B\"0,1F1,\"1B1\r\n\"\r\n"), expected, "quoted");
  // A quote left open runs to the end of the file, where Python's reader closes it.
  expect_same(load("0F0,,,0F1,0B0,,0B1\r\n,1F0,1B0,1F1,\"1B1"), expected, "open quote");
}

TEST(Csv, AMalformedActionIsRefusedNamingItsRankPositionAndText) {
  const std::string m = error_of("0F0,0B0\n1F0,1X0,1B0\n");
  EXPECT_MESSAGE(m, "test.csv: rank 1, position 1: '1X0' is not a pipeline action");
  EXPECT_MESSAGE(error_of("0F0,garbage\n"), "rank 0, position 1: 'garbage' is not a pipeline action");
  EXPECT_MESSAGE(error_of("0F\"0,0B0\n"), "rank 0, position 0: '0F\"0' is not a pipeline action");
  EXPECT_MESSAGE(error_of("0F0,0B0x\n"), "'0B0x' is not a pipeline action");
}

TEST(Csv, BinaryGarbageIsRefusedWithTheBytesEscaped) {
  EXPECT_MESSAGE(error_of(std::string("0F0,0B\0"
                                      "0\n",
                                      9)),
                 "rank 0, position 1: '0B\\x000' is not a pipeline action");
  EXPECT_MESSAGE(error_of("\x89PNG\r\n\x1a\n"), "rank 0, position 0: '\\x89PNG' is not a pipeline action");
}

TEST(Csv, HugeAndNegativeNumbersAreRefusedWithoutOverflow) {
  EXPECT_MESSAGE(error_of("99999999999999999999F0,0B0\n"), "'99999999999999999999F0' is not a pipeline action");
  EXPECT_MESSAGE(error_of("0F99999999999,0B0\n"), "'0F99999999999' is not a pipeline action");
  EXPECT_MESSAGE(error_of("0F0,0B0,2000000000F0\n"),
                 "rank 0, position 2, 2000000000F0: stage 2000000000 cannot exist in a schedule of 3 actions");
  EXPECT_MESSAGE(error_of("0F0,0B0,0F2147483647\n"),
                 "rank 0, position 2, 0F2147483647: microbatch 2147483647 cannot exist in a schedule of 3 actions");
  EXPECT_MESSAGE(error_of("-1F0,0B0\n"), "rank 0, position 0: '-1F0' is not a pipeline action");
}

TEST(Csv, AnEmptyFileOrOneWithoutActionsIsRefused) {
  EXPECT_MESSAGE(error_of(""), "test.csv: the CSV is empty");
  EXPECT_MESSAGE(error_of("\n\n"), "test.csv: the CSV holds no actions");
  EXPECT_MESSAGE(error_of(",,,\n"), "the CSV holds no actions");
}

TEST(Csv, ABlankLineIsARankAsInPython) {
  EXPECT_MESSAGE(error_of("0F0,0B0\n\n1F0,1B0\n"), "rank 1 runs no stage");
  EXPECT_MESSAGE(error_of(std::string(kOneFOneB2x2) + "\r\n"), "rank 2 runs no stage");
}

TEST(Csv, RaggedRowsAreFineAndTrailingIdleStepsAreIdle) {
  const Schedule s = load("0F0,0B0,,,\n1F0,1B0\n");
  EXPECT_EQ(s.ranks[0].size(), 5u);
  EXPECT_EQ(s.ranks[1].size(), 2u);
}

TEST(Csv, AComputeCommsFileWithAnIdleStepIsRefused) {
  const std::string text = csv_of(lower_schedule(generate_schedule(ScheduleKind::gpipe, {2, std::nullopt, 2})));
  EXPECT_EQ(error_of(text, CsvFormat::compute_comms), "");
  EXPECT_MESSAGE(error_of("," + text, CsvFormat::compute_comms), "rank 0, position 0: an empty cell (idle step)");
}

TEST(Csv, AComputeOnlyFileWithCommunicationIsRefused) {
  const std::string text = csv_of(lower_schedule(generate_schedule(ScheduleKind::gpipe, {2, std::nullopt, 2})));
  EXPECT_MESSAGE(error_of(text), "rank 0, position 1, 0SEND_F0: a compute_only schedule holds F, B, I, W");
}

TEST(Csv, AStageOnTwoRanksOrAGapInTheStagesIsRefused) {
  EXPECT_MESSAGE(error_of("0F0,0B0\n1F0,0F1,1B0\n"),
                 "rank 1, position 1, 0F1: stage 0 already runs on rank 0 (position 0): a stage runs on one rank");
  EXPECT_MESSAGE(error_of("0F0,0B0\n2F0,2B0\n"),
                 "no action runs stage 1, yet the stages go up to 2 (rank 1, position 0)");
}

TEST(Csv, AScheduleThatWouldDeadlockIsRefused) {
  EXPECT_MESSAGE(error_of("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n"), "rank 1, position 1, 1F1 waits for its input");
}

TEST(Csv, ByteOrderMarksAreRefusedWithTheFix) {
  EXPECT_MESSAGE(error_of(std::string("\xEF\xBB\xBF") + kOneFOneB2x2), "starts with a UTF-8 byte-order mark");
  EXPECT_MESSAGE(error_of(std::string("\xFF\xFE") + std::string("0\0F\0"
                                                                "0\0",
                                                                6)),
                 "UTF-16");
  // A first byte that only looks like the start of a mark is an ordinary (bad) cell.
  EXPECT_MESSAGE(error_of("\xEF"
                          "0F0,0B0\n"),
                 "rank 0, position 0: '\\xef0F0' is not a pipeline action");
}

TEST(Csv, ACellOverPythonsFieldLimitIsRefusedAtOnceEvenInA100MBLine) {
  const std::string line(100u << 20, '7');
  const auto start = std::chrono::steady_clock::now();
  const std::string m = error_of(line);
  EXPECT_LT(seconds_since(start), 2.0 * remat::testing::kSanitizerAllowance);
  EXPECT_MESSAGE(m, "rank 0, position 0: a cell longer than 131072 characters");
}

TEST(Csv, A100MBLineOfCellsIsRefusedAtTheCellLimitInLinearTime) {
  std::string line;
  line.reserve(100u << 20);
  while (line.size() < (100u << 20)) line += "0F0,";
  const auto start = std::chrono::steady_clock::now();
  const std::string m = error_of(line);
  EXPECT_LT(seconds_since(start), 10.0 * remat::testing::kSanitizerAllowance);
  EXPECT_MESSAGE(m, "rank 0, position 2097152: more than 2097152 cells");
}

TEST(Csv, AReadErrorOfTheStreamIsAPlanErrorNotAnEscapingException) {
  // A directory opens as a file stream; its first read throws from inside the stream buffer.
  std::ifstream directory(std::filesystem::temp_directory_path(), std::ios::binary);
  ASSERT_TRUE(directory.is_open());
  try {
    load_csv(directory, CsvFormat::compute_only, "dir");
    FAIL() << "a directory loaded as a schedule";
  } catch (const PlanError& e) {
    EXPECT_MESSAGE(std::string(e.what()), "dir: reading failed: ");
  }
}

TEST(Csv, AFileOfBlankLinesIsRefusedAtTheRowLimitInBoundedMemory) {
  // Each blank line is a rank with no cells; 50 MB of them once took 1.2 GB before refusal.
  EXPECT_MESSAGE(error_of(std::string((1u << 16) + 1, '\n')),
                 "test.csv: more than 65536 rows: every row (a blank one too) is a rank");
  const std::string newlines(50u << 20, '\n');
  const auto start = std::chrono::steady_clock::now();
  EXPECT_MESSAGE(error_of(newlines), "more than 65536 rows");
  EXPECT_LT(seconds_since(start), 2.0 * remat::testing::kSanitizerAllowance);
  EXPECT_MESSAGE(error_of(std::string(1u << 16, '\n') + "0F0,0B0\n"), "more than 65536 rows");
}

TEST(Csv, MoreStagesTimesMicrobatchesThanAGeneratedScheduleMayHaveIsRefused) {
  // One rank running 262145 stages of one microbatch: 2^18 + 1 stage-microbatches.
  const int stages = (1 << 18) + 1;
  std::string line;
  for (int s = 0; s < stages; ++s) line += std::to_string(s) + "F0,";
  for (int s = stages - 1; s >= 0; --s) line += std::to_string(s) + (s > 0 ? "B0," : "B0\n");
  EXPECT_MESSAGE(error_of(line),
                 "test.csv: 262145 stages x 1 microbatches is too large to plan: stages x microbatches exceeds 262144");
}

TEST(Csv, ALongValidLineLoadsInLinearTime) {
  // One rank, one stage, 200000 microbatches: 400000 cells on one line.
  std::string line;
  for (int mb = 0; mb < 200000; ++mb) line += "0F" + std::to_string(mb) + ",";
  for (int mb = 0; mb < 200000; ++mb) line += "0B" + std::to_string(mb) + (mb + 1 < 200000 ? "," : "\r\n");
  const auto start = std::chrono::steady_clock::now();
  const Schedule s = load(line);
  EXPECT_LT(seconds_since(start), 10.0 * remat::testing::kSanitizerAllowance);
  EXPECT_EQ(s.microbatches, 200000);
  EXPECT_EQ(s.ranks[0].size(), 400000u);
}

TEST(Csv, ManyRanksInAChainLoadInLinearTime) {
  // 20000 ranks, one stage each: the backward climbs one rank per lock step of the lowering,
  // which must not visit every waiting rank at every step.
  const int ranks = 20000;
  std::string text;
  for (int r = 0; r < ranks; ++r) text += std::to_string(r) + "F0," + std::to_string(r) + "B0\n";
  const auto start = std::chrono::steady_clock::now();
  const Schedule s = load(text);
  EXPECT_LT(seconds_since(start), 10.0 * remat::testing::kSanitizerAllowance);
  EXPECT_EQ(s.num_stages(), ranks);
  const Schedule lowered = lower_schedule(s);
  EXPECT_EQ(to_string(*lowered.ranks[1].front()), "1RECV_F0");
}

}  // namespace
}  // namespace remat::pipeline
