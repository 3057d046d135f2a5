#pragma once
// The lowering passes of PyTorch 2.11's pipeline runtime, one function each, over rank
// orders that have passed validate.cpp's checks of their compute actions.

#include <remat/pipeline/schedule.hpp>

#include <vector>

namespace remat::pipeline::detail {

// _add_send_recv: walks the ranks in lock step (rank 0 first in every step), putting each
// compute action in place once its input is there, its SEND right after it and the matching
// RECV at the end of the receiving rank's order. Idle steps are dropped but take their turn.
// Throws PlanError naming every stuck rank's position and action when no rank can move.
std::vector<RankOrder> add_send_recv(const std::vector<RankOrder>& orders, const std::vector<int>& stage_to_rank,
                                     int microbatches);

// _add_unshard_reshard: FSDP's UNSHARD before a stage is among the next three a rank computes
// on, RESHARD once it no longer is. Idle steps are dropped.
RankOrder add_unshard_reshard(const RankOrder& order, int num_stages);

// _add_reduce_grad: REDUCE_GRAD for a stage right after its last B or W. Idle steps are dropped.
RankOrder add_reduce_grad(const RankOrder& order, int num_stages, int microbatches);

// The checks validate_schedule makes before simulating any communication: stages and
// microbatches in range and on the right rank, each microbatch once per stage and kind, F
// before B/I, I before W, nothing missing; for compute_comms also every SEND and RECV in its
// place (check_communication).
void check_schedule(const Schedule& schedule, CsvFormat format);

}  // namespace remat::pipeline::detail
