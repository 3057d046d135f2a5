#include "renderers/streamed_snapshot.hpp"

#include "core/errors.hpp"
#include "reader/dump_reader.hpp"
#include "reader/input_file.hpp"
#include "renderers/document.hpp"
#include "renderers/renderer.hpp"

#include <filesystem>

namespace remat::report {

namespace {

// A snapshot that streams, checked; empty for anything else, which `read` then holds whole (a
// JSON Lines dump: its header line alone).
std::optional<Snapshot> stream(const std::string& path, const EventSinkFor& events, const SegmentSink& segments,
                               const StreamHooks& hooks, DumpFile& read) {
  bool begun = false;
  const EventSinkFor begin = [&](const TagTable& tags) -> EventSink& {
    begun = true;
    return events(tags);
  };
  StreamedDump dump = stream_dump(path, find_renderer("snapshot")->schema_version(), begin, segments, hooks);
  read = std::move(dump.file);
  if (!dump.streamed) return std::nullopt;
  Snapshot snapshot = read_document(read, read_snapshot);
  // Written in another order (segments or the trace before the tag table), they stayed in the
  // document.
  if (segments) {
    for (const Segment& segment : snapshot.segments) segments(segment);
  }
  if (!begun) {
    EventSink& sink = events(snapshot.tags);
    for (const Event& event : snapshot.events) sink.on_event(event);
  }
  snapshot.segments.clear();
  snapshot.events.clear();
  return snapshot;
}

}  // namespace

SnapshotInput open_streaming(const std::string& argument, const EventSinkFor& events, const SegmentSink& segments,
                             const StreamHooks& hooks) {
  std::error_code ignored;
  if (argument == kStdinArgument || !std::filesystem::is_regular_file(argument, ignored)) {
    return {open_dump(argument), std::nullopt};
  }
  SnapshotInput input;
  try {
    input.streamed = stream(argument, events, segments, hooks, input.file);
  } catch (const InputError&) {
    return {open_dump(argument), std::nullopt};
  }
  // A JSON Lines kind is read line by line from its start: its records (or, in one document, the
  // message saying it is no JSON Lines).
  if (is_json_lines_kind(input.file.kind)) input.file = open_dump(argument);
  return input;
}

SnapshotInput open_streaming(const std::string& argument, SnapshotTally& tally) {
  return open_streaming(
      argument,
      [&](const TagTable& tags) -> EventSink& {
        tally.begin(tags);
        return tally;
      },
      [&](const Segment& segment) { tally.on_segment(segment); });
}

}  // namespace remat::report
