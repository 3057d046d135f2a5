// install_cuda_allocator(): the remat::device entry points as LibTorch's CUDA allocator.

#include "pluggable_allocator.hpp"

#include <remat/cuda_allocator.hpp>

namespace remat {

void install_cuda_allocator() {
  detail::install_pluggable_allocator({.allocate = device::allocate,
                                       .deallocate = device::deallocate,
                                       .record_stream = device::record_stream,
                                       .empty_cache = device::empty_cache,
                                       .set_memory_fraction = device::set_memory_fraction});
}

bool cuda_allocator_installed() { return detail::pluggable_allocator_installed(); }

}  // namespace remat
