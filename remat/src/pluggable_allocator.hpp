#pragma once
// LibTorch's pluggable CUDA allocator over a set of tagging-allocator entry points: those of
// remat::device in C++ programs (install_cuda_allocator), or the C ABI of libremat_alloc.so
// in Python processes (libremat_pluggable.so), so both wire the same hooks the same way.

#include <cstddef>

namespace remat::detail {

struct CudaAllocatorEntryPoints {
  // Throws c10::OutOfMemoryError when the request cannot be met.
  void* (*allocate)(std::size_t bytes, int device, void* stream);
  void (*deallocate)(void* ptr, std::size_t bytes, int device) noexcept;
  void (*record_stream)(void* ptr, void* stream);
  void (*empty_cache)();
  void (*set_memory_fraction)(double fraction, int device);
};

// Makes `entry` LibTorch's CUDA allocator for the rest of the process; a second call is a
// no-op. Throws remat::Error when LibTorch has already used its own CUDA allocator.
void install_pluggable_allocator(const CudaAllocatorEntryPoints& entry);
bool pluggable_allocator_installed();

}  // namespace remat::detail
