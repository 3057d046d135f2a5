#pragma once
// Checks a schedule is one a pipeline runtime can execute: order of each microbatch's
// compute on a stage, completeness, a consistent stage-to-rank mapping and, for the
// lowered form, communication that can be ordered without deadlock.

#include <remat/pipeline/schedule.hpp>

namespace remat::pipeline {

// Throws PlanError naming the rank, the position and the action at fault.
void validate_schedule(const Schedule& schedule, CsvFormat format);

}  // namespace remat::pipeline
