#pragma once
// The summary section every dump kind shares: who wrote it, where and when.

#include "model/dump.hpp"
#include "output/table.hpp"

#include <string>

namespace remat::report {

inline Table header_table(const DumpHeader& header, const std::string& path) {
  Table table = key_value_table("dump", "Dump");
  add_field(table, "file", Cell::text(path));
  add_field(table, "kind", Cell::text(header.kind));
  add_field(table, "schema_version", Cell::integer(header.schema_version));
  add_field(table, "producer", Cell::text(header.producer));
  add_field(table, "created_at", Cell::text(header.created_at));
  add_field(table, "host", Cell::text(header.host));
  add_field(table, "pid", Cell::count(header.pid));
  add_field(table, "rank", Cell::count(header.rank));
  add_field(table, "device", Cell::count(header.device));
  return table;
}

}  // namespace remat::report
