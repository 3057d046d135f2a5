#include "pluggable_allocator.hpp"

#include "tagging_cuda_allocator.hpp"

#include <remat/errors.hpp>

#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <string>

namespace remat::detail {
namespace {

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

std::mutex g_install_mutex;
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> g_installed;  // guarded by g_install_mutex

}  // namespace

void install_pluggable_allocator(const CudaAllocatorEntryPoints& entry) {
  std::lock_guard lock(g_install_mutex);
  if (g_installed) return;
  auto allocator = std::make_shared<TaggingCudaAllocator>(entry);
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
