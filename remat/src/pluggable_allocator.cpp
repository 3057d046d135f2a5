#include "pluggable_allocator.hpp"

#include <remat/errors.hpp>

#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <memory>
#include <mutex>
#include <string>

namespace remat::detail {
namespace {

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

std::mutex g_install_mutex;
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> g_installed;  // guarded by g_install_mutex
CudaAllocatorEntryPoints g_entry{};  // set once, before g_installed

}  // namespace

void install_pluggable_allocator(const CudaAllocatorEntryPoints& entry) {
  std::lock_guard lock(g_install_mutex);
  if (g_installed) return;
  g_entry = entry;
  // LibTorch keeps std::functions; these forward to the entry points without capturing.
  auto allocator = pluggable::createCustomAllocator(
      [](std::size_t bytes, int device, cudaStream_t stream) { return g_entry.allocate(bytes, device, stream); },
      [](void* ptr, std::size_t bytes, int device, cudaStream_t) { g_entry.deallocate(ptr, bytes, device); });
  auto& hooks = static_cast<pluggable::CUDAPluggableAllocator&>(*allocator);
  hooks.set_record_stream_fn([](void* ptr, cudaStream_t stream) { g_entry.record_stream(ptr, stream); });
  hooks.set_reset_fn([] { g_entry.empty_cache(); });
  hooks.set_memory_fraction_fn([](double fraction, int device) { g_entry.set_memory_fraction(fraction, device); });
  try {
    pluggable::changeCurrentAllocator(allocator);
  } catch (const c10::Error& e) {
    throw Error("cannot make the tagging allocator LibTorch's CUDA allocator: " +
                std::string(e.what_without_backtrace()) +
                ". Install it before the first CUDA tensor is created (in C++, call "
                "remat::install_cuda_allocator() first thing in main; in Python, remat_alloc.install() right "
                "after import torch); LibTorch cannot swap an allocator it has already used");
  }
  g_installed = std::move(allocator);
}

bool pluggable_allocator_installed() {
  std::lock_guard lock(g_install_mutex);
  return g_installed != nullptr;
}

}  // namespace remat::detail
