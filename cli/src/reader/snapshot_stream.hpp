#pragma once
// A dump read front to back in bounded memory (reader/json_value_scanner.hpp), for commands that
// need a snapshot's figures, segments and events once (`trace`, `ranks`, and through
// renderers/streamed_snapshot.hpp `summary`, `memory`, `segments`, `timeline`). A snapshot's
// segments and trace events are checked one at a time, with the checks read_snapshot makes,
// handed to sinks and dropped; the rest (header, config, statistics, tag table) is parsed as a
// document. Streaming needs the header and the tag table before `segments` and `trace`, the
// order the allocator writes them; any other order, and every other kind, is kept whole.

#include "model/dump.hpp"
#include "reader/dump_file.hpp"
#include "reader/trace_file.hpp"

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

// Reads the dump at `path`. A snapshot of `snapshot_version` (the version this build reads) is
// streamed; one of another version is kept whole, for the caller to refuse. Throws InputError
// naming the path and the byte or JSON path of the problem.
StreamedDump stream_dump(const std::string& path, std::int64_t snapshot_version, const EventSinkFor& sink_for,
                         const SegmentSink& on_segment = {});

}  // namespace remat::report
