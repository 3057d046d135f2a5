#pragma once
// The fields every dump starts with (kind, schema_version, producer, created_at, host,
// pid, rank, device).

#include "json_writer.hpp"

#include <string_view>

namespace remat::alloc::detail {

// The job rank from the usual launcher variables (RANK, then SLURM_PROCID, then
// OMPI_COMM_WORLD_RANK), or 0.
int launcher_rank();
// Current UTC time as ISO 8601 with seconds, e.g. 2026-11-30T01:02:03Z.
std::string utc_timestamp();
std::string host_name();

void write_dump_header(JsonWriter& json, std::string_view kind, int schema_version, int device);

}  // namespace remat::alloc::detail
