#pragma once
// A dump argument opened for a view that needs a snapshot's segments and events once (`summary`,
// `memory`, `segments`, `timeline`, `diff`, `validate`, `export`, `whatif`). A snapshot in a file streams by
// (reader/snapshot_stream.hpp): each segment and event, checked, goes to the caller's sinks and is dropped, so a
// snapshot of a long trace ring is read in bounded memory. Everything else is read whole, as a whole read reads it:
// standard input and pipes (read once), other kinds, and a snapshot that fails a check, which is read again whole so
// that its message is the one a whole read gives (the first problem in the order read_snapshot checks, not in the
// file's order: a syntax error at the end of the file comes before a bad segment, a bad config before a bad event).

#include "model/dump.hpp"
#include "reader/dump_file.hpp"
#include "reader/snapshot_stream.hpp"
#include "renderers/snapshot_tally.hpp"

#include <optional>
#include <string>

namespace remat::report {

struct SnapshotInput {
  // The dump read whole; for a streamed snapshot, its document without segments and events.
  DumpFile file;
  // A streamed snapshot, checked as read_snapshot checks it, its segments and events gone to the
  // sinks (its own `segments` and `events` are empty).
  std::optional<Snapshot> streamed;
};

// Opens `argument` (a path, or `-`). For a streamed snapshot, `events` is called once with its
// tag table and every event goes to the sink it returns, and every segment to `segments` (where
// given), each in the file's order; `hooks` see what streams (reader/snapshot_stream.hpp). Whatever
// the sinks and hooks did for a snapshot that comes back whole (`streamed` empty) is to be undone:
// it may have streamed part of the way. An InputError from a sink or hook ends the stream and
// reads the snapshot whole. Throws InputError as open_dump does.
SnapshotInput open_streaming(const std::string& argument, const EventSinkFor& events, const SegmentSink& segments,
                             const StreamHooks& hooks = {});
// The same, a streamed snapshot's segments and events gathered by `tally`.
SnapshotInput open_streaming(const std::string& argument, SnapshotTally& tally);

}  // namespace remat::report
