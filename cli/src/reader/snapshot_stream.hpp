#pragma once
// A dump read front to back in bounded memory (reader/json_value_scanner.hpp), for commands that
// need a snapshot's figures, segments and events once (`trace`, `ranks`, and through
// renderers/streamed_snapshot.hpp `summary`, `memory`, `segments`, `timeline`, `diff`, `validate`,
// `export`, `whatif`). A snapshot's
// segments and trace events are checked one at a time, with the checks read_snapshot makes,
// handed to sinks and dropped; the rest (header, config, statistics, tag table) is parsed as a
// document. Streaming needs the header and the tag table before `segments` and `trace`, the
// order the allocator writes them; any other order, and every other kind, is kept whole.

#include "model/dump.hpp"
#include "reader/dump_file.hpp"
#include "reader/json_path.hpp"
#include "reader/trace_file.hpp"

#include <simdjson.h>

#include <cstdint>
#include <functional>
#include <string>

namespace remat::report {

struct StreamedDump {
  // The document; a streamed snapshot's `segments` and `trace.events` are empty arrays in it.
  // A JSON Lines dump: its header line only.
  DumpFile file;
  bool streamed = false;  // a snapshot whose segments and events went by
};

// Where a snapshot's events go, once its tag table is known.
using EventSinkFor = std::function<EventSink&(const TagTable& tags)>;
// Where a snapshot's segments go, each once it is checked.
using SegmentSink = std::function<void(const Segment& segment)>;

// The arrays a snapshot streams: `$.segments` and `$.trace.events`.
enum class StreamedArray : std::uint8_t { segments, events };

// What a command that needs more than the model of each segment and event is shown as they go by.
struct StreamHooks {
  // As an array begins to stream by: the document of the members before it (the array, and one
  // streamed before it, empty), for what a command needs first (`export` its header, `whatif` its
  // settings). Unchecked: the whole snapshot is checked by the time the stream ends.
  std::function<void(StreamedArray array, const DumpFile& so_far)> on_array;
  // Each element's JSON at `path` as it is parsed, before it is read into the model (`validate`
  // checks it against its schema).
  std::function<void(StreamedArray array, const JsonPath& path, simdjson::dom::element value)> on_element;
};

// Reads the dump at `path`. A snapshot of `snapshot_version` (the version this build reads) is
// streamed; one of another version is kept whole, for the caller to refuse. Throws InputError
// naming the path and the byte or JSON path of the problem.
StreamedDump stream_dump(const std::string& path, std::int64_t snapshot_version, const EventSinkFor& sink_for,
                         const SegmentSink& on_segment = {}, const StreamHooks& hooks = {});

}  // namespace remat::report
