#pragma once
// The memory report of one checkpoint (remat/diagnostics.hpp's MemoryReport): what its frame
// keeps for backward, per region, each storage billed once. The saved-tensors report shows it
// as its region detail.

#include <remat/diagnostics.hpp>

namespace remat::detail {

struct Frame;

MemoryReport memory_report_of(const Frame& frame);

}  // namespace remat::detail
