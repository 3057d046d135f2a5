#pragma once
// Shared by the runtime's reports: byte counts for people, and the header every dump starts
// with.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::detail {

// "512 B", "3.00 KiB", "1.19 MiB".
std::string human_bytes(std::int64_t bytes);

// kind, schema_version 1, producer, created_at, host, pid, rank, device 0.
nlohmann::json dump_header(std::string_view kind);

}  // namespace remat::detail
