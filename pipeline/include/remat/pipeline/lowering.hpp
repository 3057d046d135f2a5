#pragma once
// Lowering a compute-only schedule to compute and communication, as PyTorch 2.11 does.

#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/schedule.hpp>

namespace remat::pipeline {

// Exactly what PyTorch 2.11's _add_send_recv returns for the same compute-only order (idle
// steps included, since they take their turn in its lock-step walk): the same actions in the
// same order on every rank, each cross-rank F followed by its SEND_F and each cross-rank B/I by
// its SEND_B, the RECV at the receiving rank's end of the order at that moment, and no
// SEND/RECV between two stages on the same rank. Idle steps are dropped.
// Validates the schedule first; throws PlanError when it is invalid or the lowering would
// deadlock (naming every stuck rank's position and action).
Schedule lower_schedule(const Schedule& compute_only);

// What PyTorch 2.11's _PipelineScheduleRuntime runs and its _dump_csv(format="compute_comms")
// writes: _prepare_schedule_with_comms puts FSDP's UNSHARD/RESHARD (_add_unshard_reshard) and
// REDUCE_GRAD after each stage's last backward (_add_reduce_grad) into every rank's order
// before _add_send_recv, so the RECVs can land at other places than in lower_schedule.
Schedule lower_schedule_for_runtime(const Schedule& compute_only);

// What PyTorch 2.11's single-stage schedules run in their own _step_microbatches, which never
// read pipeline_order: ScheduleGPipe every forward (RECV_F, F, SEND_F) then every backward
// (RECV_B, B, SEND_B); Schedule1F1B min(M, S - s) warm-up forwards on stage s, then one
// backward and one forward in turn, then the remaining backwards. Stage s on rank s, no idle
// steps. Throws PlanError for the other schedules and for a shape generate_schedule refuses.
Schedule lower_single_stage_step(ScheduleKind kind, const ScheduleShape& shape);

}  // namespace remat::pipeline
