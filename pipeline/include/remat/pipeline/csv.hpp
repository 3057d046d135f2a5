#pragma once
// PyTorch's pipeline-order CSV (_dump_csv / _load_csv): one row per rank, one cell per
// action, an empty cell is an idle step.

#include <remat/pipeline/schedule.hpp>

#include <iosfwd>
#include <string>
#include <string_view>

namespace remat::pipeline {

// Parses and validates (see validate.hpp). `source` names the input in error messages.
// Throws PlanError naming the row (rank), the cell (position) and the text.
Schedule load_csv(std::istream& in, CsvFormat format, std::string_view source);

// Writes what PyTorch's _dump_csv writes for the same schedule.
void write_csv(std::ostream& out, const Schedule& schedule);

}  // namespace remat::pipeline
