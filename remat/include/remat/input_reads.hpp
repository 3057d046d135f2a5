#pragma once
// Which checkpoint inputs a step's ops read, for a step profile: a region may read an input of its
// checkpoint it does not take (through a closure), and a checkpoint that recomputes it keeps that
// input for recompute. While recording is on for a thread, every checkpoint forward on it watches
// its ops, inside save regions too, and notes each input they read (by storage).

#include <cstdint>
#include <vector>

namespace remat {

// Starts (or stops) recording on this thread; either way drops what was noted.
void record_input_reads(bool on);

// The storages (data addresses, as UntypedStorage.data_ptr() gives them) of the checkpoint
// inputs ops read since the last call, each once, in the order first read; then forgets them.
std::vector<std::uintptr_t> take_input_reads();

}  // namespace remat
