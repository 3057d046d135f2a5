#pragma once
// The "largest groups" table summaries end with, built from a MemoryView.

#include "renderers/renderer.hpp"

namespace remat::report {

// Rows sorted by peak (then live), largest first; `top` limits them, folding the rest into
// one "(N more)" row. Shares are of the live total and of the summed peaks.
Table memory_table(const MemoryView& view, std::size_t top, std::string id = "memory", std::string title = {});
void sort_memory_rows(std::vector<MemoryRow>& rows);

// A group's cell: a name from the dump (quoted in text when it reads like a placeholder) or
// remat-report's own placeholder label.
Cell group_cell(const GroupLabel& label);
// The column that follows a group column, for JSON and CSV only: true for placeholder labels,
// so that a group literally named "(untagged)" and untagged memory can be told apart.
Column placeholder_column();

}  // namespace remat::report
