#pragma once
// Dumps of an allocator's state, written atomically: the snapshot (one JSON document,
// schemas/snapshot.schema.json) and the trace (JSON Lines, schemas/trace.schema.json).

#include <remat/alloc/caching_allocator.hpp>

#include <string>
#include <string_view>

namespace remat::alloc {

inline constexpr int kSnapshotSchemaVersion = 1;
inline constexpr int kTraceSchemaVersion = 1;

// The fields every dump starts with besides kind, schema_version and device.
struct DumpHeader {
  std::string producer;    // "remat 0.1.0"
  std::string created_at;  // UTC, ISO 8601
  std::string host;
  std::int64_t pid = 0;
  int rank = 0;  // from RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK
};
DumpHeader current_dump_header();

// The dump as JSON text.
std::string snapshot_to_json(const AllocatorSnapshot& snapshot);

// Writes text to `path` through a temporary file in the same directory, fsync and rename:
// readers see the old file or the new one, never a partial one. Throws IoError naming the
// path, the system error and the fix.
void write_file_atomically(const std::string& path, std::string_view contents);

// The trace ring as JSON Lines: a header line with the tag tables, then one event a line.
std::string trace_to_jsonl(const AllocatorSnapshot& snapshot);

void write_snapshot(const AllocatorSnapshot& snapshot, const std::string& path);
void write_trace(const AllocatorSnapshot& snapshot, const std::string& path);

}  // namespace remat::alloc
