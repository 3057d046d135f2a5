// `summary`, `memory`, `segments` and `timeline` stream a snapshot in a file (renderers/
// streamed_snapshot.hpp) and read one from a pipe whole: both must print the same, for snapshots
// that are fine and for snapshots that break checks in an order other than read_snapshot's.

#include "cli_runner.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

namespace remat::report::testing {
namespace {

// What a command prints, and the picture it writes.
struct Shown {
  CliResult result;
  std::string picture;
};

std::vector<std::vector<std::string>> snapshot_commands(const std::string& file, const std::string& picture) {
  return {{"summary", file},
          {"summary", file, "--json"},
          {"memory", file},
          {"memory", file, "--by", "stream"},
          {"memory", file, "--by", "phase", "--csv"},
          {"memory", file, "--by", "label", "--json"},
          {"segments", file},
          {"segments", file, "--width", "0", "--json"},
          {"timeline", file, "-o", picture}};
}

Shown show(const std::vector<std::string>& command, const std::string& picture) {
  std::remove(picture.c_str());
  Shown shown{run(command), {}};
  std::ifstream in(picture, std::ios::binary);
  shown.picture.assign(std::istreambuf_iterator<char>(in), {});
  return shown;
}

// Each command on `text` as a file (streamed) and, at the same path, as a FIFO (read whole).
void expect_streamed_as_whole(const std::string& name, const std::string& text) {
  TempDir dir;
  const std::string path = dir.path("snapshot.json");
  const std::string picture = dir.path("timeline.svg");
  for (const std::vector<std::string>& command : snapshot_commands(path, picture)) {
    std::filesystem::remove(path);
    dir.write("snapshot.json", text);
    const Shown streamed = show(command, picture);
    std::filesystem::remove(path);
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    std::thread writer([&] { std::ofstream(path, std::ios::binary) << text; });
    const Shown whole = show(command, picture);
    writer.join();
    EXPECT_EQ(streamed.result.code, whole.result.code) << name << ": " << command[0] << ": " << streamed.result.err;
    EXPECT_EQ(streamed.result.out, whole.result.out) << name << ": " << command[0];
    EXPECT_EQ(streamed.result.err, whole.result.err) << name << ": " << command[0];
    EXPECT_EQ(streamed.picture, whole.picture) << name << ": " << command[0];
  }
}

// The snapshot's members with `first` moved to the front.
std::string reordered(const nlohmann::ordered_json& snapshot, const std::vector<std::string>& first) {
  nlohmann::ordered_json out;
  for (const std::string& key : first) out[key] = snapshot[key];
  for (const auto& [key, value] : snapshot.items()) {
    if (!out.contains(key)) out[key] = value;
  }
  return out.dump();
}

TEST(StreamedSnapshot, ShowsWhatAWholeReadShows) {
  for (const std::string fixture : {"snapshot-end.json", "snapshot-peak.json", "torch-snapshot.json"}) {
    const std::string text = data_text(fixture);
    const auto snapshot = nlohmann::ordered_json::parse(text);
    expect_streamed_as_whole(fixture, text);
    expect_streamed_as_whole(fixture + " pretty-printed", snapshot.dump(2));
    // Segments or the trace before the tag table stay in the document.
    expect_streamed_as_whole(fixture + " segments first", reordered(snapshot, {"segments"}));
    expect_streamed_as_whole(fixture + " trace first", reordered(snapshot, {"trace"}));
    auto no_events = snapshot;
    no_events["trace"]["events"] = nlohmann::ordered_json::array();
    expect_streamed_as_whole(fixture + " without events", no_events.dump());
  }
}

// A file streams in its own order, but a snapshot that breaks a check is refused with the message
// a whole read gives: the first problem in read_snapshot's order (syntax first, then the header,
// config, statistics and tags, then segments, then events), never the first one streamed by.
TEST(StreamedSnapshot, ASnapshotThatBreaksChecksIsRefusedAsAWholeReadRefusesIt) {
  const auto snapshot = nlohmann::ordered_json::parse(data_text("snapshot-end.json"));
  auto bad_segment = snapshot;
  bad_segment["segments"][0]["total_size"] = -1;
  auto config_and_segment = bad_segment;
  config_and_segment["config"]["backend"] = 7;
  auto segment_and_event = bad_segment;
  segment_and_event["trace"]["events"][0]["size"] = "big";
  auto overlapping = snapshot;
  overlapping["segments"].push_back(snapshot["segments"][0]);
  auto trace_first_bad_event = snapshot;
  trace_first_bad_event["trace"]["events"][0]["time_us"] = 0.5;
  const std::string one_line = snapshot.dump();
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"a bad segment, cut short", bad_segment.dump().substr(0, one_line.size() - 40)},
           {"a bad segment, then more", bad_segment.dump() + "\n{}\n"},
           {"a bad segment and a bad config", config_and_segment.dump()},
           {"a bad segment and a bad event", segment_and_event.dump()},
           {"overlapping segments", overlapping.dump()},
           {"a bad event, trace first", reordered(trace_first_bad_event, {"trace"})},
           {"a key twice", one_line.substr(0, one_line.size() - 1) + ",\"segments\":[]}"},
           {"cut short", one_line.substr(0, one_line.size() / 2)}}) {
    expect_streamed_as_whole(name, text);
  }
  // The whole read's own messages, not the streaming reader's.
  TempDir dir;
  const CliResult more = run({"summary", dir.write("s.json", bad_segment.dump() + "\n{}\n")});
  EXPECT_NE(more.err.find("this file has more lines after its first"), std::string::npos) << more.err;
  const CliResult both = run({"memory", dir.write("s.json", config_and_segment.dump())});
  EXPECT_NE(both.err.find("$.config.backend"), std::string::npos) << both.err;
}

// simdjson refuses a document nested more than 1024 levels deep. A segment or event parsed alone
// sits 2 or 3 levels higher than in its document, and is refused at the same nesting, naming the
// same byte, whatever reads it.
TEST(StreamedSnapshot, AValueNestedTooDeepIsRefusedAsAWholeReadRefusesIt) {
  const std::string text = data_text("snapshot-end.json");
  const std::string nested = std::string(1022, '[') + std::string(1022, ']');
  const std::string segment = R"("segments":[{)";
  const std::string events = R"("events":[{)";
  for (const std::string& anchor : {segment, events}) {
    std::string deep = text;
    deep.insert(deep.find(anchor) + anchor.size(), "\"x\":" + nested + ",");
    expect_streamed_as_whole(anchor, deep);
    TempDir dir;
    const std::string file = dir.write("deep.json", deep);
    const CliResult trace = run({"trace", file});
    EXPECT_EQ(trace.code, 2);
    EXPECT_EQ(trace.err, run({"summary", file}).err);
    EXPECT_NE(trace.err.find("nesting deeper than 1024 levels"), std::string::npos) << trace.err;
  }
}

}  // namespace
}  // namespace remat::report::testing
