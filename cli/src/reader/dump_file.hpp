#pragma once
// Opening a dump: detects the kind from `kind` and `schema_version`, whether the file is one
// JSON document (snapshot and most kinds) or JSON Lines (trace), and keeps a parsed document.

#include "model/dump.hpp"

#include <simdjson.h>

#include <memory>
#include <string>

namespace remat::report {

struct DumpFile {
  std::string path;
  std::string kind;
  std::int64_t schema_version = 0;
  bool json_lines = false;  // a header line followed by one record a line
  std::uint64_t file_size = 0;

  // Set for single-document dumps: the parsed document, alive as long as this object.
  std::unique_ptr<simdjson::dom::parser> parser;
  simdjson::padded_string text;
  simdjson::dom::element root;
};

// Throws InputError for an unreadable, empty, non-JSON or kind-less file.
DumpFile open_dump(const std::string& path);

}  // namespace remat::report
