#pragma once
// The tagging allocator's entry points as LibTorch's pluggable CUDA allocator calls them:
// remat::device's in C++ programs (install_cuda_allocator), the C ABI of libremat_alloc.so in
// Python processes (libremat_pluggable.so).

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

}  // namespace remat::detail
