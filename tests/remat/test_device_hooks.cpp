// The entry points LibTorch's pluggable CUDA allocator calls (remat::device), exercised on
// the host backend that device 0 uses in this binary.

#include "support.hpp"

#include <remat/cuda_allocator.hpp>

#include <remat/alloc/errors.hpp>
#include <remat/alloc/host_backend.hpp>
#include <remat/alloc/tags.hpp>

#include <c10/util/Exception.h>

#include <cstdint>

namespace {

constexpr int kDevice = 0;

void* stream(std::uintptr_t id) { return reinterpret_cast<void*>(id); }

remat::alloc::HostBackend& host_backend() {
  return dynamic_cast<remat::alloc::HostBackend&>(remat::alloc::device_allocator(kDevice).backend());
}

TEST(DeviceHooks, AllocationsCarryTheTagsInForce) {
  void* ptr = nullptr;
  {
    auto region = remat::alloc::TagScope::region("device.hooks");
    ptr = remat::device::allocate(1000, kDevice, stream(1));
  }
  ASSERT_NE(ptr, nullptr);
  EXPECT_EQ(remat::live_bytes("device.hooks"), 1000);
  remat::device::deallocate(ptr, 1000, kDevice);
  EXPECT_EQ(remat::live_bytes("device.hooks"), 0);
}

TEST(DeviceHooks, ZeroBytesGiveNullAndFreeingNullDoesNothing) {
  EXPECT_EQ(remat::device::allocate(0, kDevice, stream(1)), nullptr);
  remat::device::deallocate(nullptr, 0, kDevice);
}

TEST(DeviceHooks, OutOfMemoryIsLibTorchsErrorAndTheAllocatorStaysUsable) {
  auto& allocator = remat::alloc::device_allocator(kDevice);
  const std::uint64_t ooms = allocator.stats().num_ooms;
  try {
    remat::device::allocate(std::size_t{2} << 30, kDevice, stream(1));  // beyond the 1 GiB host capacity
    FAIL() << "a request beyond capacity must fail";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(allocator.stats().num_ooms, ooms + 1);
  void* ptr = remat::device::allocate(4096, kDevice, stream(1));
  EXPECT_NE(ptr, nullptr);
  remat::device::deallocate(ptr, 4096, kDevice);
}

TEST(DeviceHooks, ABadFreeIsCountedNotThrown) {
  auto& allocator = remat::alloc::device_allocator(kDevice);
  const std::uint64_t invalid = allocator.stats().num_invalid_frees;
  int local = 0;
  remat::device::deallocate(&local, sizeof local, kDevice);
  void* ptr = remat::device::allocate(256, kDevice, stream(1));
  remat::device::deallocate(ptr, 128, kDevice);  // wrong size: refused, block stays live
  EXPECT_EQ(allocator.stats().num_invalid_frees, invalid + 2);
  remat::device::deallocate(ptr, 256, kDevice);
}

TEST(DeviceHooks, RecordStreamDelaysReuseOnTheOwningAllocator) {
  host_backend().hold_stream(7);
  void* first = remat::device::allocate(1 << 20, kDevice, stream(1));
  remat::device::record_stream(first, stream(7));
  remat::device::deallocate(first, 1 << 20, kDevice);
  void* second = remat::device::allocate(1 << 20, kDevice, stream(1));
  EXPECT_NE(second, first);  // stream 7 may still read the first block
  host_backend().complete_stream(7);
  void* third = remat::device::allocate(1 << 20, kDevice, stream(1));
  EXPECT_EQ(third, first);
  remat::device::deallocate(second, 1 << 20, kDevice);
  remat::device::deallocate(third, 1 << 20, kDevice);
}

TEST(DeviceHooks, RecordStreamOnAnUnknownPointerNamesTheProblem) {
  int local = 0;
  try {
    remat::device::record_stream(&local, stream(7));
    FAIL() << "an unknown pointer must be refused";
  } catch (const remat::alloc::InvalidPointerError& e) {
    EXPECT_NE(std::string(e.what()).find("not the start of a live block"), std::string::npos) << e.what();
  }
}

TEST(DeviceHooks, EmptyCacheReturnsFreeSegments) {
  auto& allocator = remat::alloc::device_allocator(kDevice);
  void* ptr = remat::device::allocate(std::size_t{64} << 20, kDevice, stream(1));
  const std::int64_t reserved = allocator.stats().reserved_bytes.current;
  remat::device::deallocate(ptr, std::size_t{64} << 20, kDevice);
  EXPECT_EQ(allocator.stats().reserved_bytes.current, reserved);  // cached
  remat::device::empty_cache();
  EXPECT_LE(allocator.stats().reserved_bytes.current, reserved - (std::int64_t{64} << 20));
}

TEST(DeviceHooks, MemoryFractionCapsReservedBytes) {
  remat::device::set_memory_fraction(0.25, kDevice);  // 256 MiB of the 1 GiB host capacity
  EXPECT_THROW(remat::device::allocate(std::size_t{300} << 20, kDevice, stream(1)), c10::OutOfMemoryError);
  remat::device::set_memory_fraction(1.0, kDevice);
  void* ptr = remat::device::allocate(std::size_t{300} << 20, kDevice, stream(1));
  EXPECT_NE(ptr, nullptr);
  remat::device::deallocate(ptr, std::size_t{300} << 20, kDevice);
  remat::device::empty_cache();
}

TEST(DeviceHooks, AFractionOutsideTheRangeIsAClearError) {
  for (const double bad : {0.0, -0.5, 1.5}) {
    try {
      remat::device::set_memory_fraction(bad, kDevice);
      FAIL() << bad << " must be refused";
    } catch (const remat::Error& e) {
      EXPECT_NE(std::string(e.what()).find("outside (0, 1]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
