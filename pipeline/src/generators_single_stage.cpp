// GPipe and 1F1B: one stage per rank, stage r on rank r.
//
// PyTorch 2.11 builds their pipeline_order in _get_pipeline_order as a timeline with idle
// steps (None) and then passes it through _add_reduce_grad, which drops the idle steps and
// appends one REDUCE_GRAD per rank. These functions return the timeline before that pass, so
// that the single-stage schedules read like the multi-stage ones (compute only, idle steps
// kept) and can be fed to _PipelineScheduleRuntime._load_csv, which refuses REDUCE_GRAD in a
// compute-only CSV.

#include "detail/generators.hpp"

#include <optional>

namespace remat::pipeline::detail {

Schedule gpipe(int ranks, int microbatches) {
  Schedule schedule = make_schedule(ranks, loop_stage_to_rank(ranks, ranks), microbatches);
  for (int rank = 0; rank < ranks; ++rank) {
    RankOrder& order = schedule.ranks[static_cast<std::size_t>(rank)];
    idle(order, rank);
    for (int mb = 0; mb < microbatches; ++mb) order.emplace_back(Action::on(rank, ActionType::forward, mb));
    idle(order, 3 * (ranks - 1 - rank));
    for (int mb = 0; mb < microbatches; ++mb) order.emplace_back(Action::on(rank, ActionType::full_backward, mb));
  }
  return schedule;
}

// PyTorch 2.11's Schedule1F1B._get_pipeline_order numbers the last rank's forwards 1..M (its
// forward counter starts one ahead when that rank has no warm-up forwards); here they are
// 0..M-1 like every other rank's, which is what Schedule1F1B._step_microbatches runs.
Schedule one_f_one_b(int ranks, int microbatches) {
  Schedule schedule = make_schedule(ranks, loop_stage_to_rank(ranks, ranks), microbatches);
  for (int rank = 0; rank < ranks; ++rank) {
    RankOrder& order = schedule.ranks[static_cast<std::size_t>(rank)];
    idle(order, rank);
    const int warmup_forwards = ranks - 1 - rank;
    int next_forward = 0;
    for (; next_forward < warmup_forwards; ++next_forward) {
      order.emplace_back(Action::on(rank, ActionType::forward, next_forward));
    }
    idle(order, 2 * (ranks - 1 - rank));
    int next_backward = 0;
    while (next_forward < microbatches) {
      order.emplace_back(Action::on(rank, ActionType::forward, next_forward++));
      order.emplace_back(Action::on(rank, ActionType::full_backward, next_backward++));
    }
    while (next_backward < microbatches) {
      order.emplace_back(std::nullopt);
      order.emplace_back(Action::on(rank, ActionType::full_backward, next_backward++));
    }
  }
  return schedule;
}

}  // namespace remat::pipeline::detail
