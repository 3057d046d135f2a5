#pragma once
// Turns parsed JSON of the report dumps (remat-trace, memory-report, saved-report, oom) into
// the model, checking every field's type and range. Errors name the JSON path.

#include "model/reports.hpp"
#include "reader/json_fields.hpp"

namespace remat::report {

RematTraceDump read_remat_trace(json::object root);
MemoryReportDump read_memory_report(json::object root);
SavedReportDump read_saved_report(json::object root);
OomDump read_oom(json::object root);

}  // namespace remat::report
