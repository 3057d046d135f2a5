#pragma once
// The trace of checkpoint forwards this thread ran, for collect_trace() (remat/diagnostics.hpp):
// the runtime records each forward's scope as it finishes.

#include <remat/diagnostics.hpp>

namespace remat::detail {

void record_scope(CheckpointScope scope);

}  // namespace remat::detail
