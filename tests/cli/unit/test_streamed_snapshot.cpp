// `summary`, `memory`, `segments`, `timeline`, `diff`, `validate`, `export` and `whatif` stream a
// snapshot in a file (renderers/streamed_snapshot.hpp) and read one from a pipe whole: both must
// print (and write) the same, for snapshots that are fine and for snapshots that break checks in an
// order other than read_snapshot's.

#include "cli_runner.hpp"
#include "schema/schema_set.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

namespace remat::report::testing {
namespace {

// What a command prints, and the file it writes (-o).
struct Shown {
  CliResult result;
  std::string written;
};

std::vector<std::vector<std::string>> snapshot_commands(const std::string& file, const TempDir& dir) {
  const std::string other = data_path("snapshot-peak.json");
  return {{"summary", file},
          {"summary", file, "--json"},
          {"memory", file},
          {"memory", file, "--by", "stream"},
          {"memory", file, "--by", "phase", "--csv"},
          {"memory", file, "--by", "label", "--json"},
          {"segments", file},
          {"segments", file, "--width", "0", "--json"},
          {"timeline", file, "-o", dir.path("timeline.svg")},
          {"diff", file, other},
          {"diff", other, file, "--by", "stream", "--json"},
          {"validate", file},
          {"validate", file, "--json", "--max-errors", "1"},
          {"export", file, "--to", "torch-snapshot", "-o", dir.path("out.pickle")},
          // Refused for the input where the input is bad, for the output where it is fine.
          {"export", file, "--to", "torch-snapshot", "-o", dir.path("missing/out.pickle")},
          {"whatif", file},
          {"whatif", file, "--capacity", "300000", "--conf", "expandable_segments:True", "--csv"}};
}

Shown show(const std::vector<std::string>& command) {
  const auto o = std::find(command.begin(), command.end(), "-o");
  const std::string out = o == command.end() ? std::string() : *(o + 1);
  if (!out.empty()) std::remove(out.c_str());
  Shown shown{run(command), {}};
  std::ifstream in(out, std::ios::binary);
  if (!out.empty()) shown.written.assign(std::istreambuf_iterator<char>(in), {});
  return shown;
}

// Files a command left in `dir` beside those named.
std::vector<std::string> left_over(const TempDir& dir, const std::vector<std::string>& named) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path(""))) {
    const std::string name = entry.path().filename().string();
    if (std::find(named.begin(), named.end(), name) == named.end()) files.push_back(name);
  }
  return files;
}

using Commands = std::function<std::vector<std::vector<std::string>>(const std::string& file, const TempDir& dir)>;

// Each command on `text` as a file (streamed) and, at the same path, as a FIFO (read whole).
void expect_streamed_as_whole(const std::string& name, const std::string& text,
                              const Commands& commands = snapshot_commands) {
  TempDir dir;
  const std::string path = dir.path("snapshot.json");
  for (const std::vector<std::string>& command : commands(path, dir)) {
    std::filesystem::remove(path);
    dir.write("snapshot.json", text);
    const Shown streamed = show(command);
    std::filesystem::remove(path);
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    std::thread writer([&] { std::ofstream(path, std::ios::binary) << text; });
    const Shown whole = show(command);
    writer.join();
    EXPECT_EQ(streamed.result.code, whole.result.code) << name << ": " << command[0] << ": " << streamed.result.err;
    EXPECT_EQ(streamed.result.out, whole.result.out) << name << ": " << command[0];
    EXPECT_EQ(streamed.result.err, whole.result.err) << name << ": " << command[0];
    EXPECT_EQ(streamed.written, whole.written) << name << ": " << command[0];
    // No temporary file of an export that streamed part of the way.
    EXPECT_EQ(left_over(dir, {"snapshot.json", "timeline.svg", "out.pickle"}), std::vector<std::string>{})
        << name << ": " << command[0];
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

// The snapshot's members with `last` moved to the end.
std::string moved_last(const nlohmann::ordered_json& snapshot, const std::string& last) {
  nlohmann::ordered_json out;
  for (const auto& [key, value] : snapshot.items()) {
    if (key != last) out[key] = value;
  }
  out[last] = snapshot[last];
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

// What only the schema refuses (a creation time that is no time, an event's `requested` of 0), what
// `whatif` sets its runs up from and `export` writes first, and members in orders those two cannot
// follow as they stream (the device after the segments, the trace's figures after its events, the
// settings or the segments after the trace): each shown as a whole read shows it.
TEST(StreamedSnapshot, WhatValidateExportAndWhatifReadFirstIsShownAsAWholeReadShowsIt) {
  const auto snapshot = nlohmann::ordered_json::parse(data_text("snapshot-end.json"));
  std::size_t alloc = 0;
  while (snapshot["trace"]["events"][alloc]["action"] != "alloc") ++alloc;
  auto late = snapshot;
  late["created_at"] = "yesterday";
  auto nothing_requested = snapshot;
  nothing_requested["trace"]["events"][alloc]["requested"] = 0;
  auto both = nothing_requested;
  both["created_at"] = "yesterday";
  auto imported = snapshot;
  imported["producer"] = "remat-report import (PyTorch memory snapshot)";
  auto unparsable = snapshot;
  unparsable["config"]["text"] = "no_such_setting:1";
  auto dropped = snapshot;
  dropped["trace"]["dropped"] = 3;
  auto small = snapshot;
  small["device_memory"]["total_bytes"] = 300000;
  auto device = snapshot;
  device["device"] = 2;
  auto events_first = snapshot;
  events_first["trace"] = nlohmann::ordered_json{{"events", snapshot["trace"]["events"]},
                                                 {"capacity", snapshot["trace"]["capacity"]},
                                                 {"dropped", snapshot["trace"]["dropped"]}};
  auto no_segments = snapshot;
  no_segments["segments"] = nlohmann::ordered_json::array();
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"a creation time that is no time", late.dump()},
           {"an event requesting 0 bytes", nothing_requested.dump()},
           {"both", both.dump()},
           {"imported", imported.dump()},
           {"unparsable settings", unparsable.dump()},
           {"a ring that dropped records", dropped.dump()},
           {"a device too small for the trace", small.dump()},
           {"device 2", device.dump()},
           {"no segments", no_segments.dump()},
           {"the trace's events before its figures", events_first.dump()},
           {"the device after the segments", moved_last(snapshot, "device")},
           {"the settings after the trace", moved_last(snapshot, "config")},
           {"the segments after the trace", moved_last(snapshot, "segments")}}) {
    expect_streamed_as_whole(name, text);
  }
}

// `validate --schema-dir`: a schema that checks segments or events more strictly than the built-in
// one is applied to each as it streams by; one that sees the snapshot only whole (a oneOf at its
// root), one broken inside the segments' items, one that wants a segment at least and a directory
// lacking the snapshot's schema: each gives what a whole read gives.
TEST(StreamedSnapshot, ValidateReadsASchemaDirectoryAsAWholeReadReadsIt) {
  TempDir schemas;
  const auto with = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    for (const auto& [file, text] : embedded_schemas()) {
      nlohmann::json schema = nlohmann::json::parse(text);
      if (file == "snapshot.schema.json") edit(schema);
      std::filesystem::create_directories(schemas.path(name));
      if (!schema.is_null()) schemas.write(name + "/" + std::string(file), schema.dump());
    }
    return schemas.path(name);
  };
  const std::vector<std::string> dirs = {
      with("strict", [](nlohmann::json& s) { s["$defs"]["event"]["properties"]["size"]["minimum"] = 1048576; }),
      with("bounded", [](nlohmann::json& s) { s["$defs"]["event"]["properties"]["size"]["maximum"] = 1 << 30; }),
      with("blocks",
           [](nlohmann::json& s) { s["properties"]["segments"]["items"]["properties"]["blocks"]["minItems"] = 3; }),
      with("one-of",
           [](nlohmann::json& s) {
             s["oneOf"] = {{{"type", "object"}}, {{"type", "array"}}};
           }),
      with("broken", [](nlohmann::json& s) { s["properties"]["segments"]["items"]["bogus"] = 1; }),
      with("a-segment", [](nlohmann::json& s) { s["properties"]["segments"]["minItems"] = 1; }),
      with("lacking", [](nlohmann::json& s) { s = nullptr; })};
  const Commands validate = [&](const std::string& file, const TempDir&) {
    std::vector<std::vector<std::string>> commands;
    for (const std::string& dir : dirs) {
      commands.push_back({"validate", file, "--schema-dir", dir});
      commands.push_back({"validate", file, "--schema-dir", dir, "--json", "--max-errors", "2"});
    }
    return commands;
  };
  const auto snapshot = nlohmann::ordered_json::parse(data_text("snapshot-end.json"));
  auto no_segments = snapshot;
  no_segments["segments"] = nlohmann::ordered_json::array();
  auto huge_event = snapshot;
  huge_event["trace"]["events"].back()["size"] = std::uint64_t{1} << 31;
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"as written", snapshot.dump()}, {"no segments", no_segments.dump()}, {"a huge event", huge_event.dump()}}) {
    expect_streamed_as_whole(name, text, validate);
  }
  // The strict schema refuses the fixture's events of 512.5 KiB, which the others take.
  EXPECT_EQ(run({"validate", data_path("snapshot-end.json"), "--schema-dir", dirs[0]}).code, 2);
  EXPECT_EQ(run({"validate", data_path("snapshot-end.json"), "--schema-dir", dirs[1]}).code, 0);
}

}  // namespace
}  // namespace remat::report::testing
