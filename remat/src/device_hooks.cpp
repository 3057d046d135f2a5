// remat::device (cuda_allocator.hpp): the tagging allocator's device entry points, as
// LibTorch's pluggable CUDA allocator calls them.

#include <remat/cuda_allocator.hpp>
#include <remat/errors.hpp>

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/errors.hpp>

#include "torch_oom_message.hpp"

#include <c10/util/Exception.h>

#include <cstdio>
#include <string>

namespace remat::device {
namespace {

alloc::Stream as_stream(void* stream) { return reinterpret_cast<alloc::Stream>(stream); }

}  // namespace

void* allocate(std::size_t bytes, int device, void* stream) {
  try {
    return alloc::device_allocator(device).allocate(bytes, as_stream(stream));
  } catch (const alloc::OutOfMemoryError& e) {
    C10_THROW_ERROR(OutOfMemoryError, detail::torch_oom_message(e.what(), true));
  }
}

void deallocate(void* ptr, std::size_t bytes, int device) noexcept {
  if (ptr == nullptr) return;
  try {
    alloc::device_allocator(device).deallocate(ptr, bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat: %s\n", e.what());
  }
}

void record_stream(void* ptr, void* stream) { alloc::record_stream_anywhere(ptr, as_stream(stream)); }

void empty_cache() {
  alloc::for_each_device_allocator([](alloc::CachingAllocator& allocator) { allocator.empty_cache(); });
}

void set_memory_fraction(double fraction, int device) {
  try {
    alloc::set_memory_fraction(device, fraction);
  } catch (const alloc::InvalidArgumentError& e) {
    throw Error(e.what());
  }
}

}  // namespace remat::device
