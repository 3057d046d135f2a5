// The runtime's reports as JSON documents, and writing them (report_json.hpp).

#include "report_json.hpp"

#include <remat/diagnostics.hpp>

#include <remat/alloc/dump.hpp>

namespace remat {
namespace detail {

nlohmann::json dump_header(std::string_view kind) {
  alloc::JsonWriter json;
  json.begin_object();
  alloc::write_dump_header(json, kind, 1, 0);
  json.end_object();
  return nlohmann::json::parse(json.str());
}

}  // namespace detail

void write_dump(const std::string& path, const std::string& json) { alloc::write_file_atomically(path, json); }

}  // namespace remat
