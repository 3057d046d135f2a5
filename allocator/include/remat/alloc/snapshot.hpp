#pragma once
// Dumps of an allocator's state, written atomically: the snapshot (one JSON document,
// schemas/snapshot.schema.json) and the trace (JSON Lines, schemas/trace.schema.json).

#include <remat/alloc/allocator_snapshot.hpp>

#include <string>

namespace remat::alloc {

inline constexpr int kSnapshotSchemaVersion = 1;
inline constexpr int kTraceSchemaVersion = 1;

// The dump as JSON text.
std::string snapshot_to_json(const AllocatorSnapshot& snapshot);
// The trace ring as JSON Lines: a header line with the tag tables, then one event a line.
std::string trace_to_jsonl(const AllocatorSnapshot& snapshot);

void write_snapshot(const AllocatorSnapshot& snapshot, const std::string& path);
void write_trace(const AllocatorSnapshot& snapshot, const std::string& path);

}  // namespace remat::alloc
