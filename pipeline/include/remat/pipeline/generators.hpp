#pragma once
// The schedules torch.distributed.pipelining generates, action for action as PyTorch 2.11
// produces them (compute-only form), with PyTorch's limits on their shapes.

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
std::optional<ScheduleKind> parse_schedule_kind(std::string_view name);
const std::vector<ScheduleKind>& all_schedule_kinds();

struct ScheduleShape {
  int ranks = 0;
  // Stages per rank. nullopt = what the schedule takes by default (1 for single-stage
  // schedules, 2 for the V-shaped ones).
  std::optional<int> virtual_stages;
  int microbatches = 0;
};

// Throws PlanError for a shape PyTorch refuses (or that is not positive), naming the
// parameter, its value and what the schedule accepts.
Schedule generate_schedule(ScheduleKind kind, const ScheduleShape& shape);

}  // namespace remat::pipeline
