// Wires the remat::device entry points into LibTorch's C++ pluggable CUDA allocator.

#include <remat/cuda_allocator.hpp>
#include <remat/errors.hpp>

#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <memory>
#include <mutex>
#include <string>

namespace remat {
namespace {

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

std::mutex g_install_mutex;
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> g_installed;  // guarded by g_install_mutex

}  // namespace

void install_cuda_allocator() {
  std::lock_guard lock(g_install_mutex);
  if (g_installed) return;
  auto allocator = pluggable::createCustomAllocator(
      [](std::size_t bytes, int device, cudaStream_t stream) { return device::allocate(bytes, device, stream); },
      [](void* ptr, std::size_t bytes, int device, cudaStream_t) { device::deallocate(ptr, bytes, device); });
  auto& hooks = static_cast<pluggable::CUDAPluggableAllocator&>(*allocator);
  hooks.set_record_stream_fn([](void* ptr, cudaStream_t stream) { device::record_stream(ptr, stream); });
  hooks.set_reset_fn([] { device::empty_cache(); });
  hooks.set_memory_fraction_fn([](double fraction, int device) { device::set_memory_fraction(fraction, device); });
  try {
    pluggable::changeCurrentAllocator(allocator);
  } catch (const c10::Error& e) {
    throw Error("cannot make the tagging allocator LibTorch's CUDA allocator: " +
                std::string(e.what_without_backtrace()) +
                ". Call remat::install_cuda_allocator() before the first CUDA tensor is created; LibTorch cannot "
                "swap an allocator it has already used");
  }
  g_installed = std::move(allocator);
}

bool cuda_allocator_installed() {
  std::lock_guard lock(g_install_mutex);
  return g_installed != nullptr;
}

}  // namespace remat
