#include <remat/cpu_allocator.hpp>

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/errors.hpp>

#include "torch_oom_message.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace remat {
namespace {

// LibTorch's CPU allocator interface over one of the allocator's host pools.
template <alloc::CachingAllocator& (*Pool)()>
class TaggingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    void* ptr = nullptr;
    try {
      ptr = Pool().allocate(bytes, 0);
    } catch (const alloc::OutOfMemoryError& e) {
      C10_THROW_ERROR(OutOfMemoryError, detail::torch_oom_message(e.what(), false));
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  static void release(void* ptr) { Pool().deallocate(ptr); }
};

// Priority high enough to replace LibTorch's default CPU allocator.
constexpr std::uint8_t kPriority = 100;

}  // namespace

c10::Allocator* tagging_cpu_allocator() {
  static auto* instance = new TaggingCpuAllocator<alloc::cpu_allocator>();  // tensors may outlive every guard
  return instance;
}

c10::Allocator* offload_host_allocator() {
  static auto* instance = new TaggingCpuAllocator<alloc::pinned_host_allocator>();
  return instance;
}

CpuAllocatorGuard::CpuAllocatorGuard() : previous_(c10::GetCPUAllocator()) {
  c10::SetCPUAllocator(tagging_cpu_allocator(), kPriority);
}

CpuAllocatorGuard::~CpuAllocatorGuard() { c10::SetCPUAllocator(previous_, kPriority); }

std::int64_t live_bytes(std::string_view region_prefix) {
  std::int64_t total = 0;
  alloc::for_each_device_allocator(
      [&](alloc::CachingAllocator& allocator) { total += allocator.live_requested_bytes(region_prefix); });
  return total;
}

}  // namespace remat
