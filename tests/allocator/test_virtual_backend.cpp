// The virtual backend `whatif` replays on: address ranges counted against a capacity, no memory.

#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/config.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/virtual_backend.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>

namespace remat::alloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kPiB = std::size_t{1} << 50;

TEST(VirtualBackend, CountsAllocationsAgainstItsCapacityWithoutMemory) {
  VirtualBackend backend(64 * kMiB, 3);
  EXPECT_EQ(backend.device(), 3);
  void* a = backend.allocate(40 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(backend.allocate(30 * kMiB), nullptr);  // 40 + 30 > 64
  EXPECT_EQ(backend.memory_info().free_bytes, 24 * kMiB);
  void* b = backend.allocate(24 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  backend.deallocate(a, 40 * kMiB);
  backend.deallocate(b, 24 * kMiB);
  EXPECT_EQ(backend.used_bytes(), 0u);
  EXPECT_EQ(backend.device_allocations(), 2u);
  EXPECT_EQ(backend.device_releases(), 2u);
}

TEST(VirtualBackend, ReusesFreedRangesMergedWithTheirNeighbours) {
  VirtualBackend backend(kPiB);
  auto* a = static_cast<char*>(backend.allocate(2 * kMiB));
  auto* b = static_cast<char*>(backend.allocate(2 * kMiB));
  auto* c = static_cast<char*>(backend.allocate(2 * kMiB));
  ASSERT_EQ(b, a + 2 * kMiB);
  ASSERT_EQ(c, b + 2 * kMiB);
  backend.deallocate(a, 2 * kMiB);
  backend.deallocate(b, 2 * kMiB);
  EXPECT_EQ(backend.allocate(4 * kMiB), a);  // a and b merged, the smallest free range that fits
  EXPECT_EQ(backend.allocate(1), c + 2 * kMiB);  // whole granules, after c
}

TEST(VirtualBackend, ReservingAndReleasingWithoutEndNeverRunsOutOfAddresses) {
  // Each expandable segment reserves the device and an eighth more: 1.125 PiB here, so without
  // reuse the 64-bit space would be gone after about 14,500 of them.
  VirtualBackend backend(kPiB);
  for (int i = 0; i < 100000; ++i) {
    void* range = backend.reserve(kPiB + kPiB / 8);
    ASSERT_NE(range, nullptr) << "reservation " << i;
    backend.release(range, kPiB + kPiB / 8);
  }
}

TEST(VirtualBackend, ExpandableSegmentsGrowAndShrinkOnItForever) {
  Config config;
  config.expandable_segments = true;
  config.trace_entries = 0;
  CachingAllocator allocator(std::make_unique<VirtualBackend>(kPiB), config);
  for (int i = 0; i < 20000; ++i) {
    void* block = allocator.allocate(3 * kMiB, 0);
    ASSERT_NE(block, nullptr) << "cycle " << i;
    allocator.deallocate(block);
    allocator.empty_cache();  // unmaps the segment and gives its reservation back
  }
  EXPECT_EQ(allocator.stats().reserved_bytes.current, 0);
}

TEST(VirtualBackend, ACapacityTooLargeToReserveIsAnOutOfMemoryErrorNotAWrappedRange) {
  // The capacity and an eighth more does not fit in 64 bits: the reservation must not wrap
  // around to a small range that later growth would overrun.
  Config config;
  config.expandable_segments = true;
  config.trace_entries = 0;
  CachingAllocator allocator(std::make_unique<VirtualBackend>(std::numeric_limits<std::size_t>::max()), config);
  allocator.set_oom_reporting(false);
  EXPECT_THROW(allocator.allocate(64 * kMiB, 0), OutOfMemoryError);
  EXPECT_EQ(allocator.stats().reserved_bytes.current, 0);
}

}  // namespace
}  // namespace remat::alloc
