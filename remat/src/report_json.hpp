#pragma once
// The runtime's reports as JSON documents, starting from the header every dump has (report_json.cpp
// also writes them to files: remat::write_dump).

#include <nlohmann/json.hpp>

#include <string_view>

namespace remat::detail {

// An object holding the common dump header (<remat/alloc/dump.hpp>) for `kind`.
nlohmann::json dump_header(std::string_view kind);

}  // namespace remat::detail
