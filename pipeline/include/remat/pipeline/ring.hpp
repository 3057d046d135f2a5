#pragma once
// NeMo AutoModel's recv_buffer_pool sizing, for comparison with the colored plan: a ring of
// max(2, min(M, S - s + slack)) buffer sets per stage, offered for plain 1F1B only. It can
// be one set short (1F1B's lowered forward depth on stage s >= 1 is S - s + 1), which the
// plan flags; see plan.hpp.

#include <string_view>

namespace remat::pipeline {

// NeMo's gate: true for 1F1B in any letter case ("1f1b", "1F1B"), false for every other
// schedule (GPipe, interleaved, zero-bubble, ...), unknown names and the empty name.
bool schedule_supports_recv_pool(std::string_view schedule_name);

// max(2, min(microbatches, stages - stage_index + slack)). Throws PlanError for a negative
// slack, a stage index outside 0..stages-1, or a count that is not positive.
int nemo_ring_size(int stages, int stage_index, int microbatches, int slack);

}  // namespace remat::pipeline
