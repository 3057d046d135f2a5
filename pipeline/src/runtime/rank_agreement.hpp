#pragma once
// Before the first transfer, every rank shares what its transfers depend on (the schedule, the
// microbatches, the stage map, the lowered actions, the activation shape and dtype) and checks
// that all ranks agree. A rank started with other options would otherwise send messages of
// another size (Gloo ends the receiving process) or wait for transfers no peer makes (every
// rank times out and blames a peer).

#include <remat/pipeline/communicator.hpp>
#include <remat/pipeline/runtime.hpp>
#include <remat/pipeline/schedule.hpp>

namespace remat::pipeline::detail {

// Shares this rank's settings with every rank and throws RuntimeError naming the setting and the
// ranks that differ (every rank throws the same message).
void agree_across_ranks(Communicator& communicator, const Schedule& lowered, const RuntimeOptions& options);

}  // namespace remat::pipeline::detail
