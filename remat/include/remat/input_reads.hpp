#pragma once
// Which checkpoint inputs a step's ops read, for a step profile: a region may read an input of its
// checkpoint it does not take (through a closure), and a checkpoint that recomputes it keeps that
// input for recompute. While recording is on for a thread, every checkpoint forward on it watches
// its ops, inside save regions too, and notes each input they read (by storage), and each
// collective op they run (a c10d or functional collective: recompute would run it again).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace remat {

// Starts (or stops) recording on this thread; either way drops what was noted.
void record_input_reads(bool on);

// The storages (data addresses, as UntypedStorage.data_ptr() gives them) of the checkpoint
// inputs ops read since the last call, each once, in the order first read; then forgets them.
std::vector<std::uintptr_t> take_input_reads();

// How many ops ran inside save regions while recording since the last call; then forgets them.
// Watching costs each of them its inputs boxed for the observer: a step profile takes that out of
// the seconds it measures for a region.
std::size_t take_ops_watched_in_save_regions();

// The names of the collective ops (c10d::allreduce_, _c10d_functional::all_gather_into_tensor,
// ...) checkpoint forwards ran while recording since the last call, in order; then forgets them.
std::vector<std::string> take_collectives();

}  // namespace remat
