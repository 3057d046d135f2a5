#pragma once
// Checks a schedule is one a pipeline runtime can execute: order of each microbatch's
// compute on a stage, completeness, a consistent stage-to-rank mapping and communication that
// can be ordered without deadlock.

#include <remat/pipeline/schedule.hpp>

namespace remat::pipeline {

// Every rank runs a stage and every stage runs on the rank stage_to_rank names; each stage
// runs F once for every microbatch 0..M-1 and then either B, or I and later W; F comes before
// its B or I, I before its W. compute_only: only F, B, I, W and OVERLAP_F_B groups, and
// lowering (lower_schedule) must not deadlock. compute_comms: no idle steps; each cross-rank F
// and B/I has its SEND after it and its peer's RECV before the consumer, none between stages
// on one rank, receives from a peer posted in the order it sends, and a run of all ranks in
// which a compute waits for the data it receives reaches the end.
// Throws PlanError naming the rank, the position and the action at fault.
void validate_schedule(const Schedule& schedule, CsvFormat format);

}  // namespace remat::pipeline
