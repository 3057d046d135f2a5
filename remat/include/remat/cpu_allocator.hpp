#pragma once
// Routes LibTorch's CPU allocations through the tagging allocator, so every CPU tensor
// carries the region, policy and phase tags in force when it was allocated.

#include <cstdint>
#include <string_view>

namespace c10 {
struct Allocator;
}

namespace remat {

// Installs the tagging allocator as LibTorch's CPU allocator for its lifetime and puts the
// previous allocator back on destruction. Tensors it allocated stay valid afterwards.
class CpuAllocatorGuard {
 public:
  CpuAllocatorGuard();
  ~CpuAllocatorGuard();
  CpuAllocatorGuard(const CpuAllocatorGuard&) = delete;
  CpuAllocatorGuard& operator=(const CpuAllocatorGuard&) = delete;

 private:
  c10::Allocator* previous_;
};

// LibTorch's CPU allocator interface over the tagging allocator, for code that allocates
// through it explicitly (at::detail::empty_generic) whether or not a guard is in force.
c10::Allocator* tagging_cpu_allocator();
// The same over the allocator's pinned host pool (alloc::pinned_host_allocator()): host copies
// of device tensors (remat::CpuOffload).
c10::Allocator* offload_host_allocator();

// Requested bytes currently live (CPU tensors through the guard, plus every device
// allocator) whose region equals `region_prefix` or is nested under it: "layers.0" covers
// "layers.0::attention" but not "layers.01". An empty prefix covers everything.
std::int64_t live_bytes(std::string_view region_prefix);

}  // namespace remat
