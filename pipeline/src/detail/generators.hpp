#pragma once
// One function per schedule family, each building PyTorch 2.11's compute-only order for a
// shape that generate_schedule has already checked against PyTorch's limits.

#include <remat/pipeline/schedule.hpp>

#include <vector>

namespace remat::pipeline::detail {

// torch.distributed.pipelining._utils.generate_stage_to_rank_mapping: "loop" puts stage s on
// rank s % ranks; "v" zigzags, so with two stages per rank, rank r holds r and 2R-1-r.
std::vector<int> loop_stage_to_rank(int ranks, int stages);
std::vector<int> v_stage_to_rank(int ranks, int stages);

Schedule gpipe(int ranks, int microbatches);                                        // ScheduleGPipe
Schedule one_f_one_b(int ranks, int microbatches);                                  // Schedule1F1B
Schedule looped_bfs(int ranks, int virtual_stages, int microbatches);               // ScheduleLoopedBFS
Schedule interleaved_1f1b(int ranks, int virtual_stages, int microbatches);         // ScheduleInterleaved1F1B
Schedule interleaved_zero_bubble(int ranks, int virtual_stages, int microbatches);  // ScheduleInterleavedZeroBubble
Schedule zbv_zero_bubble(int ranks, int microbatches);                              // ScheduleZBVZeroBubble
Schedule dualpipev(int ranks, int microbatches);                                    // ScheduleDualPipeV

}  // namespace remat::pipeline::detail
