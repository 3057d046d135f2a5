#pragma once
// The header every dump remat-report writes starts with (kind, schema_version, producer,
// created_at, host, pid, rank, device): the allocator's one writer of it, as a JSON object the
// writer of the rest fills in.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string_view>

namespace remat::report {

nlohmann::ordered_json dump_header_json(std::string_view kind, int schema_version, std::uint64_t device = 0);

}  // namespace remat::report
