#pragma once
// PyTorch's pipeline-order CSV (_dump_csv / _load_csv): one row per rank, one cell per
// action, an empty cell is an idle step.

#include <remat/pipeline/schedule.hpp>

#include <iosfwd>
#include <string>
#include <string_view>

namespace remat::pipeline {

// Reads the CSV as Python's csv.reader does for PyTorch's _load_csv (lines end at \n, \r\n or
// \r; quoted cells; a blank line is a rank with no actions), infers the stage-to-rank mapping
// and the microbatch count from the actions, and validates the schedule (see validate.hpp).
// Refuses byte-order marks, cells over Python's 131072-character field limit, files of more
// than 2^21 cells or 2^16 rows, and schedules of more than 2^18 stages x microbatches (the
// limit generated schedules have). Throws PlanError starting with `source` and naming the rank (row, from 0),
// the position (cell, from 0) and the text or action.
Schedule load_csv(std::istream& in, CsvFormat format, std::string_view source);

// Writes byte for byte what PyTorch's _dump_csv writes for the same schedule (Python's
// csv.writer: "\r\n" after each row, a row of one idle step as "").
void write_csv(std::ostream& out, const Schedule& schedule);

}  // namespace remat::pipeline
