#pragma once
// What the diagnostics keep of the runtime's checkpoints (diagnostics.cpp): the scopes
// collect_trace() returns, the frames of finished forwards backward may still recompute, and
// the memory report of one.

#include <remat/diagnostics.hpp>

namespace remat::detail {

struct Frame;

// Records of finished checkpoint forwards for collect_trace().
void record_scope(CheckpointScope scope);

// Frames of finished forwards still alive (backward may recompute them), for reports of
// what every live checkpoint keeps.
void register_live_frame(Frame& frame);
MemoryReport memory_report_of(const Frame& frame);

}  // namespace remat::detail
