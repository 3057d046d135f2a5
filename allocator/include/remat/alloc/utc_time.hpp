#pragma once
// Wall-clock instants as UTC text, for dump headers, OOM dump file names and reports.

#include <cstdint>
#include <string>

namespace remat::alloc {

// Microseconds since the Unix epoch, now.
std::int64_t now_us();

// ISO 8601 in UTC: "2026-11-30T01:02:03Z", or "2026-11-30T01:02:03.000123Z" with microseconds.
std::string utc_text(std::int64_t time_us, bool with_microseconds);

// The same instant for a file name, sortable and free of colons: "20261130T010203.000123Z".
std::string utc_file_stamp(std::int64_t time_us);

}  // namespace remat::alloc
