#pragma once
// Turns parsed JSON into the model, checking every field's type, range and cross-references
// (tag and name indices). Errors name the JSON path.

#include "model/dump.hpp"
#include "reader/json_fields.hpp"

namespace remat::report {

DumpHeader read_dump_header(json::object root, const JsonPath& path);
TagTable read_tag_table(json::object root, const JsonPath& path);
Snapshot read_snapshot(json::object root);
TraceHeader read_trace_header(json::object root);
// One event object; `tags` bounds the tag index.
Event read_event(json::element value, const JsonPath& path, std::size_t tag_count);
Stat read_stat(json::element value, const JsonPath& path);

}  // namespace remat::report
