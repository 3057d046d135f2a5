#pragma once
// fork() copies only the calling thread. A lock another thread held at that moment stays held
// in the child for good, and the child's first allocation spins on it (DataLoader workers fork
// while the main thread allocates). The registry's fork handlers take every process-wide lock
// before fork and release them on both sides after; these hold and release the tag tables'.

namespace remat::alloc::detail {

void hold_tag_tables_for_fork();
void release_tag_tables_after_fork();

}  // namespace remat::alloc::detail
