#pragma once
// The memory report of one checkpoint (remat/diagnostics.hpp's MemoryReport): what its frame
// keeps for backward, per region, each storage billed once. The saved-tensors report shows it
// as its region detail.

#include <remat/diagnostics.hpp>

namespace remat::detail {

struct Frame;

// `tensors`, where given, collects the tensors the report lists, in its order.
MemoryReport memory_report_of(const Frame& frame, std::vector<at::Tensor>* tensors = nullptr);

}  // namespace remat::detail
