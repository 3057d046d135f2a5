#pragma once
// Makes the tagging allocator LibTorch's CUDA allocator (TaggingCudaAllocator over a set of
// entry points), so C++ programs and Python processes wire the same hooks the same way.

#include "cuda_allocator_entry_points.hpp"

namespace remat::detail {

// Makes `entry` LibTorch's CUDA allocator for the rest of the process; a second call is a
// no-op. Throws remat::Error when LibTorch has already used its own CUDA allocator.
void install_pluggable_allocator(const CudaAllocatorEntryPoints& entry);
bool pluggable_allocator_installed();

}  // namespace remat::detail
