#pragma once
// The tagging allocator as LibTorch's CUDA allocator, through LibTorch's C++
// pluggable-allocator API: every CUDA tensor then carries the region, policy, phase and
// site tags in force when it was allocated, and live_bytes(), snapshots, traces and OOM
// reports cover device memory.
//
//   int main() {
//     remat::install_cuda_allocator();  // before the first CUDA tensor
//     auto x = at::randn({1024, 1024}, at::kCUDA);
//   }
//
// install_cuda_allocator() is in the remat::cuda library (CUDA builds with LibTorch's CUDA
// libraries). The remat::device functions it wires in are in remat::remat and work on any
// backend, so other integrations can call them too.

#include <cstddef>

namespace remat {

// Makes the tagging allocator LibTorch's CUDA allocator for the rest of the process.
// Calling it again is a no-op. Throws remat::Error when LibTorch has already allocated
// CUDA memory through its own allocator (LibTorch cannot swap an allocator it has used):
// call it first thing in main, before any CUDA tensor or CUDA library handle is created.
void install_cuda_allocator();
bool cuda_allocator_installed();

namespace device {

// The allocator entry points LibTorch's pluggable allocator calls, on the tagging
// allocator of `device`. allocate throws c10::OutOfMemoryError (what LibTorch callers catch)
// when the request cannot be met, after the OOM report and observers have run.
void* allocate(std::size_t bytes, int device, void* stream);
// Never throws (LibTorch frees from destructors): an unknown pointer or wrong size is
// refused, counted in the allocator's stats and reported on stderr.
void deallocate(void* ptr, std::size_t bytes, int device) noexcept;
// The block behind `ptr`, on whichever device owns it, is also used on `stream`.
void record_stream(void* ptr, void* stream);
// Returns the cached segments of every device to the backend.
void empty_cache();
// Caps `device`'s reserved bytes at `fraction` (in (0, 1]) of its memory.
void set_memory_fraction(double fraction, int device);

}  // namespace device
}  // namespace remat
