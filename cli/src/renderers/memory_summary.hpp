#pragma once
// The "largest groups" table summaries end with, built from a MemoryView.

#include "renderers/renderer.hpp"

namespace remat::report {

// Rows sorted by peak (then live), largest first; `top` limits them, folding the rest into
// one "(N more)" row. Shares are of the live total and of the summed peaks.
Table memory_table(const MemoryView& view, std::size_t top, std::string id = "memory", std::string title = {});
void sort_memory_rows(std::vector<MemoryRow>& rows);

}  // namespace remat::report
