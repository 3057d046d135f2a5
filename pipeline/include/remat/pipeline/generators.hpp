#pragma once
// The schedules torch.distributed.pipelining generates, action for action as PyTorch 2.11
// produces them (compute-only form), with PyTorch's limits on their shapes.
//
// What is matched, per schedule class:
// - Multi-stage classes (ScheduleInterleaved1F1B, ScheduleLoopedBFS,
//   ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV): their
//   `pipeline_order`, idle steps (None) included.
// - ScheduleGPipe and Schedule1F1B: PyTorch runs them without an action list, but 2.11 builds
//   one in `_get_pipeline_order` (stored as `pipeline_order`): a timeline with idle steps that
//   it then passes through `_add_reduce_grad`, which drops the idle steps and appends
//   `rREDUCE_GRAD` to each rank. We return the timeline before that pass, so that these read
//   like the multi-stage schedules and load into `_PipelineScheduleRuntime._load_csv`.
// - Known PyTorch bug, not reproduced: Schedule1F1B's `_get_pipeline_order` numbers the last
//   rank's forwards 1..M instead of 0..M-1 (that rank has no warm-up forwards, and its counter
//   starts one ahead); PyTorch's own validation refuses that order (a B0 without F0). We
//   number them 0..M-1, as Schedule1F1B._step_microbatches runs them.
//
// Stage s runs on rank s % R for GPipe, 1F1B, Interleaved 1F1B, Looped BFS and Interleaved
// Zero Bubble; rank r holds stages r and 2R-1-r (a V) for ZBV Zero Bubble and DualPipeV.

#include <remat/pipeline/schedule.hpp>

#include <optional>
#include <string_view>
#include <vector>

namespace remat::pipeline {

enum class ScheduleKind {
  gpipe,
  one_f_one_b,
  interleaved_1f1b,
  looped_bfs,
  interleaved_zero_bubble,
  zbv_zero_bubble,
  dualpipev,
};

// The command-line names: "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs",
// "interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev".
std::string_view to_string(ScheduleKind kind);
// Accepts the command-line names and PyTorch's get_schedule_class names ("Interleaved1F1B",
// "ZBVZeroBubble", ...), in any case and with or without '-' and '_'.
std::optional<ScheduleKind> parse_schedule_kind(std::string_view name);
const std::vector<ScheduleKind>& all_schedule_kinds();

struct ScheduleShape {
  int ranks = 0;
  // Stages per rank. nullopt = what the schedule takes by default: 1 for GPipe and 1F1B, 2 for
  // the others (the V-shaped ones take exactly 2; the looped ones any count from 1).
  std::optional<int> virtual_stages;
  int microbatches = 0;
};

// Throws PlanError for a shape PyTorch refuses (or that is not positive), naming the
// parameter, its value and what the schedule accepts. PyTorch 2.11's limits:
// - 1F1B: microbatches >= stages.
// - Interleaved 1F1B and Interleaved Zero Bubble: microbatches a multiple of the number of
//   rounds, max(1, microbatches / ranks) (with 4 ranks: 1-8, 10, 12, 15, 16, 20, 24, 28, ...).
// - ZBV Zero Bubble and DualPipeV: exactly 2 stages per rank; DualPipeV: microbatches >= 2 x ranks.
// - GPipe and Looped BFS: any count.
// Also refused, where PyTorch has no limit: ranks x virtual_stages x max(microbatches,
// 2 x ranks) above 2^18, a schedule too large to plan.
Schedule generate_schedule(ScheduleKind kind, const ScheduleShape& shape);

}  // namespace remat::pipeline
