#pragma once
// JSON objects that hold a key twice are refused: readers disagree on which value wins
// (simdjson keeps the first, Python's json the last), so such a dump has no one meaning.

#include "reader/json_path.hpp"

#include <simdjson.h>

namespace remat::report {

// Throws InputError naming the JSON path of the second occurrence of the first duplicated
// key found, e.g. `$.segments[3].blocks[0].size`; `path` is where `value` sits.
void refuse_duplicate_keys(simdjson::dom::element value, const JsonPath& path = JsonPath());

}  // namespace remat::report
