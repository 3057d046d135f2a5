#pragma once
// Lowering a compute-only schedule to compute and communication, as PyTorch 2.11's
// _add_send_recv does: the same actions in the same order on every rank, and no
// SEND/RECV between two stages on the same rank.

#include <remat/pipeline/schedule.hpp>

namespace remat::pipeline {

// Throws PlanError when the schedule cannot be lowered (it would deadlock).
Schedule lower_schedule(const Schedule& compute_only);

}  // namespace remat::pipeline
