#include "output/dump_header.hpp"

#include <remat/alloc/dump.hpp>

namespace remat::report {

nlohmann::ordered_json dump_header_json(std::string_view kind, int schema_version, std::uint64_t device) {
  alloc::JsonWriter header;
  header.begin_object();
  alloc::write_dump_header(header, kind, schema_version, 0);
  header.end_object();
  nlohmann::ordered_json root = nlohmann::ordered_json::parse(header.str());
  root["device"] = device;  // the allocator's writer takes a CUDA index; a trace's device is any whole number
  return root;
}

}  // namespace remat::report
