// Event streams that would print impossible figures are invalid in every subcommand, with the
// event number (counted from 1) and its line or JSON path; traces that only look odd (frees of
// blocks allocated before the dump began) stay valid and print no impossible figure.
#include "cli_runner.hpp"
#include "core/errors.hpp"
#include "reader/event_checks.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace remat::report::testing {
namespace {

// The byte offset of event line `index` (0-based) in trace_text(events).
std::size_t offset_of(const std::vector<std::string>& events, std::size_t index) {
  std::size_t offset = trace_text({}).size();
  for (std::size_t i = 0; i < index; ++i) offset += events[i].size() + 1;
  return offset;
}

std::string at_line(const std::string& file, const std::vector<std::string>& events, std::size_t index) {
  return file + ": line " + std::to_string(index + 2) + " (byte " + std::to_string(offset_of(events, index)) + ")";
}

TEST(EventConsistency, AnAllocAtALiveAddressIsInvalidInEverySubcommand) {
  TempDir dir;
  const std::vector<std::string> events = {event("alloc", 1, 4096, 512, 1), event("alloc", 2, 4096, 256, 2)};
  const std::string file = dir.write("t.jsonl", trace_text(events));
  expect_refused_by_every_command(
      file, dir,
      at_line(file, events, 1) +
          ": event 2: $.address: alloc at 0x1000 while the block allocated there by event 1 is still live (no "
          "free_requested or free_completed between them): events were lost or the dump is corrupt");
}

TEST(EventConsistency, AnAllocAtALiveAddressIsInvalidInASnapshotToo) {
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  nlohmann::json& events = snapshot["trace"]["events"];
  const nlohmann::json first = events[1];
  ASSERT_EQ(first["action"], "alloc");
  events.insert(events.begin() + 2, first);
  events[2]["time_us"] = events[1]["time_us"];
  const std::string file = dir.write("s.json", snapshot.dump());
  expect_refused_by_every_command(
      file, dir,
      file + ": $.trace.events[2]: event 3: $.address: alloc at 0x" +
          fmt::format("{:x}", first["address"].get<std::uint64_t>()) +
          " while the block allocated there by event 2 is still live (no free_requested or free_completed between "
          "them): events were lost or the dump is corrupt");
}

TEST(EventConsistency, ReservedBytesBeyond64BitsAreInvalidInEverySubcommand) {
  TempDir dir;
  const std::vector<std::string> events = {event("segment_alloc", 1, 0, 9223372036854775808ull, 0),
                                           event("segment_alloc", 2, 9223372036854775808ull, 9223372036854775807ull, 0),
                                           event("segment_alloc", 3, 1, 5, 0)};
  const std::string file = dir.write("t.jsonl", trace_text(events));
  expect_refused_by_every_command(
      file, dir,
      at_line(file, events, 2) + ": event 3: $.size: reserved bytes overflow 64 bits with this segment of 5 bytes");
}

TEST(EventConsistency, SnapshotSegmentsAddingUpBeyond64BitsAreInvalid) {
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  const auto segment = [](std::uint64_t address, std::uint64_t size) {
    return nlohmann::json{
        {"address", address},  {"total_size", size}, {"stream", 0},         {"segment_type", "large"},
        {"allocated_size", 0}, {"active_size", 0},   {"requested_size", 0}, {"blocks", nlohmann::json::array()}};
  };
  snapshot["segments"] = {segment(0, 9223372036854775808ull), segment(9223372036854775808ull, 9223372036854775807ull),
                          segment(16, 16)};
  const std::string file = dir.write("s.json", snapshot.dump());
  for (const char* command : {"segments", "summary", "memory", "validate"}) {
    const CliResult r = run({command, file});
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_NE(r.err.find(file + ": $.segments[2].total_size: the segments' sizes add up to more than 2^64 - 1 bytes"),
              std::string::npos)
        << command << ": " << r.err;
  }
}

TEST(EventConsistency, SnapshotTagStatsAddingUpBeyond64BitsAreInvalid) {
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  snapshot["tag_stats"][1]["bytes"]["current"] = 18446744073709551615ull;
  snapshot["tag_stats"][1]["bytes"]["peak"] = 18446744073709551615ull;
  const std::string file = dir.write("s.json", snapshot.dump());
  for (const char* command : {"memory", "summary", "diff", "validate"}) {
    const std::vector<std::string> args = std::string(command) == "diff" ? std::vector<std::string>{command, file, file}
                                                                         : std::vector<std::string>{command, file};
    const CliResult r = run(args);
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_NE(r.err.find(file + ": $.tag_stats[1]: the tags' bytes or counts add up to more than 2^64 - 1: the "
                                "snapshot is corrupt"),
              std::string::npos)
        << command << ": " << r.err;
  }
}

TEST(EventConsistency, ReportTotalsThatWrapAroundAreInvalid) {
  TempDir dir;
  nlohmann::json saved = nlohmann::json::parse(data_text("saved-report.json"));
  saved["region_bytes"] = 18446744073709551615ull;
  saved["outside_bytes"] = 1;
  saved["total_bytes"] = 0;  // the sum, wrapped around
  const std::string saved_file = dir.write("saved.json", saved.dump());
  CliResult r = run({"summary", saved_file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: " + saved_file +
                       ": $.total_bytes: 0 is not region_bytes + outside_bytes (18446744073709551615 + 1)\n");

  nlohmann::json report = nlohmann::json::parse(data_text("memory-report.json"));
  report["regions"].push_back(report["regions"][0]);
  report["regions"][1]["bytes"] = 18446744073709551615ull;
  const std::string report_file = dir.write("report.json", report.dump());
  r = run({"memory", report_file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "remat-report: " + report_file +
                ": $.regions[1].bytes: the regions' bytes add up to more than 2^64 - 1: the report is corrupt\n");
}

TEST(EventConsistency, ABlockEndingPastTheAddressSpaceIsInvalid) {
  TempDir dir;
  const std::vector<std::string> events = {event("alloc", 1, 18446744073709551600ull, 32, 1)};
  const std::string file = dir.write("t.jsonl", trace_text(events));
  expect_refused_by_every_command(file, dir,
                                  at_line(file, events, 0) +
                                      ": event 1: $.size: 32 bytes at 0xfffffffffffffff0 end past the 64-bit "
                                      "address space");
}

TEST(EventConsistency, ASegmentAllocAtAReservedAddressIsInvalid) {
  TempDir dir;
  const std::vector<std::string> events = {event("segment_alloc", 1, 1 << 20, 2 << 20, 0),
                                           event("segment_alloc", 2, 1 << 20, 2 << 20, 0)};
  const std::string file = dir.write("t.jsonl", trace_text(events));
  const CliResult r = run({"validate", file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "invalid: " + at_line(file, events, 1) +
                       ": event 2: $.address: segment_alloc at 0x100000 while the segment allocated there by event 1 "
                       "is still reserved (no segment_free between them): events were lost or the dump is corrupt\n");
}

TEST(EventConsistency, ATimeSpanBeyond64BitsIsInvalid) {
  TempDir dir;
  const std::vector<std::string> events = {event("alloc", -9223372036854775807LL, 4096, 1, 1),
                                           event("alloc", 9223372036854775807LL, 8192, 1, 1)};
  const std::string file = dir.write("t.jsonl", trace_text(events));
  expect_refused_by_every_command(file, dir,
                                  at_line(file, events, 1) +
                                      ": event 2: $.time_us: 9223372036854775807 is too far from the first event's "
                                      "time -9223372036854775807: the span does not fit in 64 bits");
}

TEST(EventConsistency, ATraceOfFreesOnlyHasNoPeakTime) {
  TempDir dir;
  const std::string file =
      dir.write("t.jsonl",
                trace_text({event("free_requested", 1000, 4096, 512, 1), event("free_completed", 1200, 4096, 512, 1)}));
  const CliResult summary = run({"summary", file, "--json"});
  ASSERT_EQ(summary.code, 0) << summary.err;
  const nlohmann::json memory = nlohmann::json::parse(summary.out)["memory"];
  EXPECT_EQ(memory["peak_live"], 0);
  EXPECT_TRUE(memory["peak_after"].is_null());
  EXPECT_EQ(memory["unmatched_frees"], 1);
  const CliResult text = run({"summary", file});
  EXPECT_NE(text.out.find("  peak_after       -\n"), std::string::npos) << text.out;

  const CliResult timeline = run({"timeline", file, "-o", dir.path("t.svg"), "--json"});
  ASSERT_EQ(timeline.code, 0) << timeline.err;
  EXPECT_TRUE(nlohmann::json::parse(timeline.out)["timeline"]["peak_after"].is_null());
  std::ifstream svg(dir.path("t.svg"));
  const std::string picture((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_EQ(picture.find("id=\"peak\""), std::string::npos) << "a peak marker for a trace that never held memory";
  EXPECT_NE(picture.find("data-peak-time-us=\"\""), std::string::npos);
}

TEST(EventConsistency, ReallocatingAfterTheFreeRequestIsConsistent) {
  TempDir dir;
  // A producer that records no free_completed may hand out the address again right away.
  const std::string file =
      dir.write("t.jsonl", trace_text({event("alloc", 1, 4096, 512, 1), event("free_requested", 2, 4096, 512, 1),
                                       event("alloc", 3, 4096, 256, 2), event("free_requested", 4, 9999, 8, 1)}));
  const CliResult r = run({"validate", file});
  EXPECT_EQ(r.code, 0) << r.err;
  const CliResult memory = run({"memory", file, "--json"});
  ASSERT_EQ(memory.code, 0) << memory.err;
  EXPECT_EQ(nlohmann::json::parse(memory.out)["memory_total"]["live_bytes"], 256);
}

TEST(EventChecker, NamesTheEventAndTheEarlierOneItConflictsWith) {
  EventChecker checker;
  checker.check(Event{Action::alloc, 5, 0x2000, 64, 0, 0});
  checker.check(Event{Action::free_completed, 6, 0x9000, 64, 0, 0});  // allocated before the dump began
  try {
    checker.check(Event{Action::alloc, 7, 0x2000, 64, 0, 0});
    FAIL() << "an alloc at a live address was accepted";
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()),
              "event 3: $.address: alloc at 0x2000 while the block allocated there by event 1 is still live (no "
              "free_requested or free_completed between them): events were lost or the dump is corrupt");
  }
}

TEST(EventChecker, RefusesEventsOutOfTimeOrder) {
  EventChecker checker;
  checker.check(Event{Action::alloc, 10, 0x2000, 64, 0, 0});
  try {
    checker.check(Event{Action::free_requested, 9, 0x2000, 64, 0, 0});
    FAIL() << "an event out of time order was accepted";
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()), "event 2: $.time_us: events are out of time order (9 after 10)");
  }
}

}  // namespace
}  // namespace remat::report::testing
