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

// A trace of `events` is refused by every subcommand naming event `index`'s line, then `problem`.
void expect_trace_refused_at(const std::vector<std::string>& events, std::size_t index, const std::string& problem) {
  TempDir dir;
  const std::string file = dir.write("t.jsonl", trace_text(events));
  expect_refused_by_every_command(file, dir, at_line(file, events, index) + problem);
}

TEST(EventConsistency, AnAllocAtALiveAddressIsInvalidInEverySubcommand) {
  expect_trace_refused_at(
      {event("alloc", 1, 4096, 512, 1), event("alloc", 2, 4096, 256, 2)}, 1,
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
  // Segments that do not overlap fit the 64-bit address space, so reserved bytes past 64 bits come
  // from one that overlaps another, refused as such
  expect_trace_refused_at({event("segment_alloc", 1, 0, 9223372036854775808ull, 0),
                           event("segment_alloc", 2, 9223372036854775808ull, 9223372036854775807ull, 0),
                           event("segment_alloc", 3, 1, 5, 0)},
                          2,
                          ": event 3: $.address: segment_alloc of 5 bytes at 0x1 overlaps the segment of "
                          "9223372036854775808 bytes at 0x0 that event 1 allocated and no segment_free released: "
                          "events were lost or the dump is corrupt");
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

TEST(EventConsistency, GroupPeaksAddingUpBeyond64BitsAreInvalidWhereTheyAreSummed) {
  TempDir dir;
  // Each region peaks at `size` bytes, one after another: live bytes stay within 64 bits, but
  // the peaks the peak shares divide by add up to three times as much.
  const auto regions_peaking_at = [](std::uint64_t size) {
    std::vector<std::string> events;
    for (int tag = 0; tag < 3; ++tag) {
      events.push_back(event("alloc", 2 * tag, 4096, size, tag));
      events.push_back(event("free_requested", 2 * tag + 1, 4096, size, tag));
    }
    return trace_text(events);
  };
  const std::string file = dir.write("t.jsonl", regions_peaking_at(9223372036854775808ull));
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"memory", file}, {"memory", file, "--top", "1"}, {"summary", file}, {"diff", file, file}}) {
    const CliResult r = run(args);
    EXPECT_EQ(r.code, 2) << args[0];
    EXPECT_EQ(r.err, "remat-report: " + file +
                         ": the peaks of the groups by region add up to more than 2^64 - 1 bytes: the dump's "
                         "allocation sizes are not real\n")
        << args[0];
  }
  // At 2^62 bytes each they fit: the peaks are shown as they are.
  const CliResult r = run({"memory", dir.write("fits.jsonl", regions_peaking_at(4611686018427387904ull)), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json memory = nlohmann::json::parse(r.out);
  ASSERT_EQ(memory["memory"].size(), 3u);
  EXPECT_EQ(memory["memory"][0]["peak_bytes"], 4611686018427387904ull);
  EXPECT_EQ(memory["memory"][0]["peak_share"], 0.333333);
}

TEST(EventConsistency, SnapshotSegmentsThatOverlapOrRepeatAnAddressAreInvalid) {
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  // segments[1] moved, with its blocks, to start 4096 bytes into segments[0].
  nlohmann::json& moved = snapshot["segments"][1];
  const std::uint64_t start = snapshot["segments"][0]["address"].get<std::uint64_t>() + 4096;
  const std::uint64_t shift = start - moved["address"].get<std::uint64_t>();
  moved["address"] = start;
  for (nlohmann::json& block : moved["blocks"]) block["address"] = block["address"].get<std::uint64_t>() + shift;
  const std::string overlapping = dir.write("overlap.json", snapshot.dump());
  for (const char* command : {"validate", "segments", "memory", "summary"}) {
    const CliResult r = run({command, overlapping});
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_NE(r.err.find(overlapping + ": $.segments[1].address: segment at 0x7fdf10597200 (2097152 bytes) overlaps "
                                       "segments[0] at 0x7fdf10596200 (12582912 bytes): segments must not share "
                                       "bytes, or reserved memory is counted twice; the snapshot is corrupt"),
              std::string::npos)
        << command << ": " << r.err;
  }

  snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  snapshot["segments"].push_back(snapshot["segments"][2]);
  const std::string repeated = dir.write("repeat.json", snapshot.dump());
  const CliResult r = run({"validate", repeated});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("$.segments[6].address: segment at 0x7fdf11398200 (2097152 bytes) overlaps segments[2] at "
                       "0x7fdf11398200"),
            std::string::npos)
      << r.err;
}

TEST(EventConsistency, AStatPeakBelowItsCurrentValueIsInvalid) {
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  snapshot["stats"]["allocated_bytes"]["peak"] = 0;
  const std::string stats = dir.write("stats.json", snapshot.dump());
  CliResult r = run({"validate", stats});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "invalid: " + stats +
                       ": $.stats.allocated_bytes.peak: peak 0 is below current 50331648: a peak is the highest "
                       "value current has reached, so at least current; the dump is corrupt (regenerate it)\n");

  snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  snapshot["tag_stats"][3]["count"]["current"] = snapshot["tag_stats"][3]["count"]["peak"].get<std::uint64_t>() + 1;
  const std::string tag_stats = dir.write("tag-stats.json", snapshot.dump());
  r = run({"memory", tag_stats});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(tag_stats + ": $.tag_stats[3].count.peak: peak "), std::string::npos) << r.err;
}

TEST(EventConsistency, ATagListedTwiceInTagStatsIsInvalid) {
  // (Before, valid, and `memory` counted the tag's bytes twice: live above peak.)
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  snapshot["tag_stats"].push_back(snapshot["tag_stats"][0]);
  const std::size_t again = snapshot["tag_stats"].size() - 1;
  const std::string file = dir.write("twice.json", snapshot.dump());
  for (const char* command : {"validate", "memory"}) {
    const CliResult r = run({command, file});
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_NE(r.err.find(fmt::format("{}: $.tag_stats[{}].tag: tag {} is listed again (first at $.tag_stats[0]): each "
                                     "tag's figures come once, and the views add them up: the snapshot is corrupt",
                                     file, again, snapshot["tag_stats"][0]["tag"].get<std::uint64_t>())),
              std::string::npos)
        << command << ": " << r.err;
  }
}

TEST(EventConsistency, ABlockEndingPastTheAddressSpaceIsInvalid) {
  expect_trace_refused_at({event("alloc", 1, 18446744073709551600ull, 32, 1)}, 0,
                          ": event 1: $.size: 32 bytes at 0xfffffffffffffff0 end past the 64-bit address space");
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

TEST(EventConsistency, ASegmentAllocOverlappingAReservedSegmentIsInvalid) {
  // Reaching into the next one, then starting inside the one before (before: both valid, and
  // `segments` counted the bytes twice)
  for (const std::uint64_t address : {std::uint64_t{0x100000} - 0x1000, std::uint64_t{0x100000} + 0x1000}) {
    TempDir dir;
    const std::vector<std::string> events = {event("segment_alloc", 1, 0x100000, 2 << 20, 0),
                                             event("segment_alloc", 2, address, 2 << 20, 0)};
    const std::string file = dir.write("t.jsonl", trace_text(events));
    const CliResult r = run({"validate", file});
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, "invalid: " + at_line(file, events, 1) +
                         fmt::format(": event 2: $.address: segment_alloc of 2097152 bytes at 0x{:x} overlaps the "
                                     "segment of 2097152 bytes at 0x100000 that event 1 allocated and no segment_free "
                                     "released: events were lost or the dump is corrupt\n",
                                     address));
  }
}

TEST(EventConsistency, ATimeSpanBeyond64BitsIsInvalid) {
  expect_trace_refused_at(
      {event("alloc", -9223372036854775807LL, 4096, 1, 1), event("alloc", 9223372036854775807LL, 8192, 1, 1)}, 1,
      ": event 2: $.time_us: 9223372036854775807 is too far from the first event's time -9223372036854775807: the span "
      "does not fit in 64 bits");
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

TEST(EventConsistency, SegmentsNameTheLiveBlocksOutsideEveryKnownSegment) {
  TempDir dir;
  // A wrapped ring: the segment_alloc of the block at 1 GiB fell off before the trace began.
  const std::string file =
      dir.write("t.jsonl", trace_text({event("segment_alloc", 0, 1 << 20, 1 << 20, 0),
                                       event("alloc", 1, 1 << 20, 8192, 1), event("alloc", 2, 1 << 30, 8192, 2)}));
  const CliResult memory = run({"memory", file, "--json"});
  ASSERT_EQ(memory.code, 0) << memory.err;
  EXPECT_EQ(nlohmann::json::parse(memory.out)["memory_total"]["live_bytes"], 16384);

  const CliResult text = run({"segments", file});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("note: 1 block(s) holding 8.00 KiB, live or pending free, lie outside every segment the "
                          "dump shows, so the map and the totals leave them out (a trace ring that dropped their "
                          "segment_alloc); `remat-report memory` counts them"),
            std::string::npos)
      << text.out;
  const CliResult json = run({"segments", file, "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const nlohmann::json totals = nlohmann::json::parse(json.out)["totals"];
  EXPECT_EQ(totals["allocated"], 8192);
  EXPECT_EQ(totals["blocks_outside_segments"], 1);
  EXPECT_EQ(totals["bytes_outside_segments"], 8192);

  const CliResult snapshot = run({"segments", data_path("snapshot-end.json"), "--json"});
  ASSERT_EQ(snapshot.code, 0) << snapshot.err;
  EXPECT_EQ(nlohmann::json::parse(snapshot.out)["totals"]["blocks_outside_segments"], 0);
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

// A trace whose ring wrapped says so where it prints live figures: blocks allocated before its
// first event and still live are not in it.
TEST(EventConsistency, ATraceWhoseRingDroppedRecordsSaysSoInMemoryAndSummary) {
  TempDir dir;
  std::string text = trace_text({event("alloc", 1, 4096, 512, 1), event("free_requested", 2, 4096, 512, 1)});
  text.replace(text.find("\"event_count\":null"), 18, "\"event_count\":2,\"dropped_records\":7");
  const std::string file = dir.write("wrapped.jsonl", text);
  const std::string note = "the trace ring had overwritten 7 records before this dump's first event";
  const CliResult memory = run({"memory", file});
  ASSERT_EQ(memory.code, 0) << memory.err;
  EXPECT_NE(memory.out.find(note), std::string::npos) << memory.out;
  const CliResult summary = run({"summary", file});
  ASSERT_EQ(summary.code, 0) << summary.err;
  EXPECT_NE(summary.out.find("dropped_records"), std::string::npos) << summary.out;
  EXPECT_NE(summary.out.find(note), std::string::npos) << summary.out;
  const CliResult valid = run({"validate", file});
  EXPECT_EQ(valid.code, 0) << valid.out << valid.err;

  const std::string whole = dir.write("whole.jsonl", trace_text({event("alloc", 1, 4096, 512, 1)}));
  EXPECT_EQ(run({"memory", whole}).out.find("trace ring had overwritten"), std::string::npos);
}

}  // namespace
}  // namespace remat::report::testing
