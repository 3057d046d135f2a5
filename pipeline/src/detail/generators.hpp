#pragma once
// One function per schedule family, each building PyTorch 2.11's compute-only order for a
// shape that generate_schedule has already checked against PyTorch's limits.

#include <remat/pipeline/schedule.hpp>

#include <optional>
#include <utility>
#include <vector>

namespace remat::pipeline::detail {

// torch.distributed.pipelining._utils.generate_stage_to_rank_mapping: "loop" puts stage s on
// rank s % ranks; "v" zigzags, so with two stages per rank, rank r holds r and 2R-1-r.
std::vector<int> loop_stage_to_rank(int ranks, int stages);
std::vector<int> v_stage_to_rank(int ranks, int stages);

// An empty order per rank, to be filled by the generator.
inline Schedule make_schedule(int ranks, std::vector<int> stage_to_rank, int microbatches) {
  Schedule schedule;
  schedule.ranks.resize(static_cast<std::size_t>(ranks));
  schedule.stage_to_rank = std::move(stage_to_rank);
  schedule.microbatches = microbatches;
  return schedule;
}

// Appends `steps` idle steps.
inline void idle(RankOrder& order, int steps) {
  for (int i = 0; i < steps; ++i) order.emplace_back(std::nullopt);
}

Schedule gpipe(int ranks, int microbatches);                                        // ScheduleGPipe
Schedule one_f_one_b(int ranks, int microbatches);                                  // Schedule1F1B
Schedule looped_bfs(int ranks, int virtual_stages, int microbatches);               // ScheduleLoopedBFS
Schedule interleaved_1f1b(int ranks, int virtual_stages, int microbatches);         // ScheduleInterleaved1F1B
Schedule interleaved_zero_bubble(int ranks, int virtual_stages, int microbatches);  // ScheduleInterleavedZeroBubble
Schedule zbv_zero_bubble(int ranks, int microbatches);                              // ScheduleZBVZeroBubble
Schedule dualpipev(int ranks, int microbatches);                                    // ScheduleDualPipeV

}  // namespace remat::pipeline::detail
