#pragma once
// Reading a single-document dump (every kind but the JSON Lines trace) into its model, with
// errors prefixed by the file's path.

#include "core/errors.hpp"
#include "output/table.hpp"
#include "reader/dump_file.hpp"
#include "reader/json_fields.hpp"

namespace remat::report {

template <typename Read>
auto read_document(const DumpFile& file, Read read) {
  try {
    return read(json::as_object(file.root, JsonPath()));
  } catch (const InputError& error) {
    throw InputError(file.path, error.what());
  }
}

// A table that shows nothing in text output but gives its rows to JSON and CSV.
inline Table machine_only(Table table) {
  table.title.clear();
  table.text_lines = std::vector<std::string>{};
  return table;
}

}  // namespace remat::report
