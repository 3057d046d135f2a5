#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

using namespace remat::alloc;
using namespace remat::alloc::testing;

TEST(Rounding, RoundsRequestsUpTo512Bytes) {
  EXPECT_EQ(round_request_size(1), 512u);
  EXPECT_EQ(round_request_size(512), 512u);
  EXPECT_EQ(round_request_size(513), 1024u);
  EXPECT_EQ(round_request_size(3 * MiB + 1), 3 * MiB + 512);
}

TEST(Rounding, ChoosesSegmentSizesLikePyTorch) {
  EXPECT_EQ(segment_size_for(512), 2 * MiB);
  EXPECT_EQ(segment_size_for(1 * MiB), 2 * MiB);
  EXPECT_EQ(segment_size_for(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(segment_size_for(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(segment_size_for(10 * MiB), 10 * MiB);
  EXPECT_EQ(segment_size_for(11 * MiB), 12 * MiB);
}

TEST(CachingAllocator, SmallRequestsShareOne2MiBSegment) {
  HostAllocator a;
  void* p = a.alloc(1000);
  void* q = a.alloc(3000);
  EXPECT_EQ(addr(q), addr(p) + 1024);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(s.segments.current, 1);
  EXPECT_EQ(s.allocated_bytes.current, 1024 + 3072);
  EXPECT_EQ(s.requested_bytes.current, 4000);
  EXPECT_EQ(a.host->used_bytes(), 2 * MiB);
  a.free(p);
  a.free(q);
}

TEST(CachingAllocator, LargestFreeBlockIsTheLargestCachedOneInEitherPool) {
  HostAllocator a;
  EXPECT_EQ(a.allocator->largest_free_block(), 0u);
  void* small = a.alloc(1000);
  EXPECT_EQ(a.allocator->largest_free_block(), 2 * MiB - 1024);  // the small segment's rest
  void* big = a.alloc(6 * MiB);
  void* after = a.alloc(2 * MiB);
  a.free(big);  // 6 MiB free at the start of a 20 MiB segment, 12 MiB free after the 2 MiB block
  EXPECT_EQ(a.allocator->largest_free_block(), 12 * MiB);
  a.free(after);  // the whole 20 MiB segment is free again
  EXPECT_EQ(a.allocator->largest_free_block(), 20 * MiB);
  a.free(small);
  EXPECT_EQ(a.allocator->config().memory_fraction, 1.0);
}

TEST(CachingAllocator, MidSizedRequestsShareA20MiBSegment) {
  HostAllocator a;
  void* p = a.alloc(5 * MiB);
  void* q = a.alloc(5 * MiB);
  EXPECT_EQ(addr(q), addr(p) + 5 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<std::int64_t>(20 * MiB));
  a.free(p);
  a.free(q);
}

TEST(CachingAllocator, SplitsLargeBlockOnlyWhenRemainderExceeds1MiB) {
  HostAllocator a;
  void* whole = a.alloc(19 * MiB);  // 20 MiB segment, 1 MiB left over: kept whole
  EXPECT_EQ(a.stats().allocated_bytes.current, static_cast<std::int64_t>(20 * MiB));
  a.free(whole);
  void* split = a.alloc(18 * MiB);  // 2 MiB left over: split off
  EXPECT_EQ(addr(split), addr(whole));
  EXPECT_EQ(a.stats().allocated_bytes.current, static_cast<std::int64_t>(18 * MiB));
  void* rest = a.alloc(2 * MiB);
  EXPECT_EQ(addr(rest), addr(split) + 18 * MiB);
  EXPECT_EQ(a.stats().segments.current, 1);
  a.free(split);
  a.free(rest);
}

TEST(CachingAllocator, SmallPoolSplitsDownTo512Bytes) {
  HostAllocator a;
  void* p = a.alloc(MiB);
  void* q = a.alloc(MiB - 512);
  void* r = a.alloc(512);
  EXPECT_EQ(addr(q), addr(p) + MiB);
  EXPECT_EQ(addr(r), addr(q) + MiB - 512);
  EXPECT_EQ(a.stats().segments.current, 1);
  a.free(p);
  a.free(q);
  a.free(r);
}

TEST(CachingAllocator, FreedNeighboursMergeBackIntoOneBlock) {
  HostAllocator a;
  void* x = a.alloc(256 * 1024);
  void* y = a.alloc(256 * 1024);
  void* z = a.alloc(256 * 1024);
  a.free(x);
  a.free(z);
  a.free(y);
  const AllocatorSnapshot snap = a.allocator->snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  ASSERT_EQ(snap.segments[0].blocks.size(), 1u);
  EXPECT_EQ(snap.segments[0].blocks[0].size, 2 * MiB);
  EXPECT_EQ(snap.segments[0].blocks[0].state, BlockState::inactive);
  EXPECT_EQ(snap.segments[0].blocks[0].address, addr(x));
}

TEST(CachingAllocator, BestFitPicksTheSmallestFreeBlockThatFits) {
  HostAllocator a;
  void* big = a.alloc(14 * MiB);
  void* fit = a.alloc(12 * MiB);
  a.free(big);
  a.free(fit);
  void* p = a.alloc(11 * MiB);
  EXPECT_EQ(addr(p), addr(fit));
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<std::int64_t>(26 * MiB));
  a.free(p);
}

TEST(CachingAllocator, ReusesCachedBlocksOnlyOnTheirOwnStream) {
  HostAllocator a;
  void* p = a.alloc(4096, /*stream=*/1);
  a.free(p);
  void* same_stream = a.alloc(4096, 1);
  EXPECT_EQ(addr(same_stream), addr(p));
  a.free(same_stream);
  void* other_stream = a.alloc(4096, 2);
  EXPECT_NE(addr(other_stream), addr(p));
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<std::int64_t>(4 * MiB));
  a.free(other_stream);
}

namespace {

// A 512-byte block allocated on stream 1, recorded on `user` (whose work is held back) and freed;
// its address.
void* freed_after_use_on(HostAllocator& a, Stream user) {
  a.host->hold_stream(user);
  void* p = a.alloc(512, 1);
  a.allocator->record_stream(p, user);
  a.free(p);
  return p;
}

}  // namespace

TEST(CachingAllocator, RecordStreamDelaysReuseUntilThatStreamCompletes) {
  HostAllocator a;
  void* p = freed_after_use_on(a, 2);
  EXPECT_EQ(a.stats().allocated_bytes.current, 0);
  EXPECT_EQ(a.stats().active_bytes.current, 512);  // still in use by stream 2
  void* q = a.alloc(512, 1);
  EXPECT_NE(addr(q), addr(p));
  EXPECT_EQ(a.allocator->snapshot().segments[0].blocks[0].state, BlockState::active_pending_free);
  a.host->complete_stream(2);
  void* r = a.alloc(512, 1);  // the next allocation retires the event and reuses p
  EXPECT_EQ(addr(r), addr(p));
  EXPECT_EQ(a.stats().active_bytes.current, 1024);
  a.free(q);
  a.free(r);
}

TEST(CachingAllocator, RecordStreamOnTheAllocatingStreamChangesNothing) {
  HostAllocator a;
  freed_after_use_on(a, 1);
  EXPECT_EQ(a.stats().active_bytes.current, 0);
}

TEST(CachingAllocator, RecordStreamOnAnUnknownPointerIsAClearError) {
  HostAllocator a;
  int local = 0;
  EXPECT_THROW(a.allocator->record_stream(&local, 3), InvalidPointerError);
}

TEST(CachingAllocator, ReleasesCachedBlocksAndRetriesBeforeDeclaringOom) {
  HostAllocator a("", /*capacity_mb=*/64);
  a.free(a.alloc(40 * MiB));
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<std::int64_t>(40 * MiB));
  void* p = a.alloc(50 * MiB);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_alloc_retries, 1u);
  EXPECT_EQ(s.num_ooms, 0u);
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(50 * MiB));
  a.free(p);
}

TEST(CachingAllocator, OutOfMemoryLeavesThePoolIntactAndUsable) {
  HostAllocator a("", 64);
  void* held = a.alloc(60 * MiB);
  try {
    a.alloc(10 * MiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on device 0 (host): tried to allocate 10.00 MiB"),
              std::string::npos)
        << e.what();
  }
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_ooms, 1u);
  EXPECT_EQ(s.allocated_bytes.current, static_cast<std::int64_t>(60 * MiB));
  a.free(held);
  void* p = a.alloc(10 * MiB);
  EXPECT_NE(p, nullptr);
  a.free(p);
  EXPECT_EQ(a.stats().allocated_bytes.current, 0);
}

TEST(CachingAllocator, OomHandlerRunsWithoutTheLockHeld) {
  HostAllocator a("", 8);
  OomEvent seen;
  a.allocator->set_oom_handler([&](const OomEvent& event) {
    seen = event;
    // Re-entering the allocator would deadlock if the lock were still held.
    seen.allocated_bytes = a.allocator->stats().allocated_bytes.current;
  });
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  EXPECT_EQ(seen.requested_bytes, 30 * MiB);
  EXPECT_EQ(seen.rounded_bytes, 30 * MiB);
  EXPECT_EQ(seen.memory.total_bytes, 8 * MiB);
}

TEST(CachingAllocator, MemoryFractionCapsReservedBytes) {
  HostAllocator a("memory_fraction:0.5", 100);
  void* p = a.alloc(40 * MiB);
  EXPECT_THROW(a.alloc(20 * MiB), OutOfMemoryError);  // 60 MiB would pass the 50 MiB cap
  a.free(p);
}

TEST(CachingAllocator, MaxSplitSizeKeepsOversizedBlocksWhole) {
  HostAllocator a("max_split_size_mb:40", 1024);
  a.free(a.alloc(60 * MiB));
  void* medium = a.alloc(30 * MiB);  // may not take the 60 MiB block
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<std::int64_t>(90 * MiB));
  void* large = a.alloc(50 * MiB);  // takes the 60 MiB block whole, unsplit
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<std::int64_t>(90 * MiB));
  EXPECT_EQ(a.stats().allocated_bytes.current, static_cast<std::int64_t>(90 * MiB));
  a.free(medium);
  a.free(large);
}

TEST(CachingAllocator, EmptyCacheReturnsFreeSegmentsOnly) {
  HostAllocator a;
  void* kept = a.alloc(512);
  a.free(a.alloc(30 * MiB));
  EXPECT_EQ(a.host->used_bytes(), 32 * MiB);
  a.allocator->empty_cache();
  EXPECT_EQ(a.host->used_bytes(), 2 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  a.free(kept);
  a.allocator->empty_cache();
  EXPECT_EQ(a.host->used_bytes(), 0u);
  EXPECT_EQ(a.stats().segments.current, 0);
}

TEST(CachingAllocator, ZeroByteRequestReturnsNullAndAllocatesNothing) {
  HostAllocator a;
  EXPECT_EQ(a.alloc(0), nullptr);
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  a.free(nullptr);  // freeing it is a no-op
}

TEST(CachingAllocator, RequestNearSizeMaxIsRefusedAndPoolStaysUsable) {
  HostAllocator a;
  for (const std::size_t size : {std::numeric_limits<std::size_t>::max(), std::numeric_limits<std::size_t>::max() - 511,
                                 kMaxRequestSize + 1}) {
    EXPECT_THROW(a.alloc(size), OutOfMemoryError);
  }
  EXPECT_EQ(a.stats().num_ooms, 3u);
  void* p = a.alloc(100);
  a.free(p);
  EXPECT_EQ(a.stats().allocated_bytes.current, 0);
}

TEST(CachingAllocator, FreeOfAnUnknownPointerIsRefused) {
  HostAllocator a;
  void* live = a.alloc(512);
  int local = 0;
  try {
    a.free(&local);
    FAIL();
  } catch (const InvalidPointerError& e) {
    EXPECT_NE(std::string(e.what()).find("never returned"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats().num_invalid_frees, 1u);
  EXPECT_EQ(a.stats().allocated_bytes.current, 512);
  a.free(live);
}

TEST(CachingAllocator, DoubleFreeIsDetectedAndNamed) {
  HostAllocator a;
  void* keep = a.alloc(512);
  void* p = a.alloc(512);
  a.free(p);
  try {
    a.free(p);
    FAIL();
  } catch (const InvalidPointerError& e) {
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats().allocated_bytes.current, 512);
  a.free(keep);
}

// A pointer into a freed block that is not where the block started was never returned: the
// message says so instead of calling it a double free.
TEST(CachingAllocator, FreeOfAPointerInsideFreedMemoryIsNotCalledADoubleFree) {
  HostAllocator a;
  void* keep = a.alloc(512);
  auto* p = static_cast<char*>(a.alloc(4096));
  a.free(p);
  try {
    a.free(p + 512);
    FAIL();
  } catch (const InvalidPointerError& e) {
    EXPECT_NE(std::string(e.what()).find("lies inside free cached memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats().num_invalid_frees, 1u);
  a.free(keep);
}

TEST(CachingAllocator, FreeOfAnInteriorPointerIsRefused) {
  HostAllocator a;
  auto* p = static_cast<char*>(a.alloc(4096));
  try {
    a.free(p + 512);
    FAIL();
  } catch (const InvalidPointerError& e) {
    EXPECT_NE(std::string(e.what()).find("points inside the live block"), std::string::npos) << e.what();
  }
  a.free(p);
}

TEST(CachingAllocator, FreeWithTheWrongSizeLeavesTheBlockAllocated) {
  HostAllocator a;
  void* p = a.alloc(1000);
  EXPECT_THROW(a.allocator->deallocate(p, 999), InvalidPointerError);
  EXPECT_EQ(a.stats().allocated_bytes.current, 1024);
  a.allocator->deallocate(p, 1000);
  EXPECT_EQ(a.stats().allocated_bytes.current, 0);
}

TEST(CachingAllocator, MemoryIsReallyUsable) {
  HostAllocator a;
  auto* bytes = static_cast<unsigned char*>(a.alloc(3 * MiB));
  for (std::size_t i = 0; i < 3 * MiB; i += 4096) bytes[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(bytes[4096], static_cast<unsigned char>(4096));
  a.free(bytes);
}

TEST(CachingAllocator, ReplaceBackendIsRefusedWhileBlocksAreLive) {
  HostAllocator a;
  void* p = a.alloc(512);
  EXPECT_THROW(a.allocator->replace_backend(std::make_unique<HostBackend>(MiB * 8), Config{}), StateError);
  a.free(p);
  a.allocator->replace_backend(std::make_unique<HostBackend>(MiB * 8), Config{});
  EXPECT_EQ(a.allocator->backend().memory_info().total_bytes, 8 * MiB);
}

TEST(CachingAllocator, ResetPeakStatsBringsPeaksDownToCurrent) {
  HostAllocator a;
  a.free(a.alloc(5 * MiB));
  EXPECT_EQ(a.stats().allocated_bytes.peak, static_cast<std::int64_t>(5 * MiB));
  a.allocator->reset_peak_stats();
  EXPECT_EQ(a.stats().allocated_bytes.peak, 0);
}

TEST(CachingAllocator, AWindowPeakIsThePeakSinceTheLastOneAndLeavesThePeakStatisticsAlone) {
  HostAllocator a;
  a.free(a.alloc(5 * MiB));
  EXPECT_EQ(a.allocator->take_requested_window_peak(), static_cast<std::int64_t>(5 * MiB));
  void* kept = a.alloc(MiB);
  a.free(a.alloc(2 * MiB));
  EXPECT_EQ(a.allocator->take_requested_window_peak(), static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(a.allocator->take_requested_window_peak(), static_cast<std::int64_t>(MiB));  // nothing since: what is held
  EXPECT_EQ(a.stats().requested_bytes.peak, static_cast<std::int64_t>(5 * MiB));
  a.allocator->reset_peak_stats();
  a.free(a.alloc(MiB));
  EXPECT_EQ(a.allocator->take_requested_window_peak(), static_cast<std::int64_t>(2 * MiB));
  a.free(kept);
}

TEST(CachingAllocator, RoundupPower2DivisionsSizeTheBlocksAsPyTorchDoes) {
  HostAllocator rounded("roundup_power2_divisions:4");
  void* p = rounded.alloc(MiB + MiB / 5);  // 1.2 MiB: the next of 4 steps between 1 and 2 MiB is 1.25 MiB
  EXPECT_EQ(rounded.stats().allocated_bytes.current, static_cast<std::int64_t>(MiB + MiB / 4));
  EXPECT_EQ(rounded.stats().requested_bytes.current, static_cast<std::int64_t>(MiB + MiB / 5));
  rounded.free(p);
  void* again = rounded.alloc(MiB + MiB / 6);  // rounds to the same 1.25 MiB and reuses the cached block
  EXPECT_EQ(addr(again), addr(p));
  rounded.free(again);
  HostAllocator plain;
  void* q = plain.alloc(MiB + MiB / 5);
  EXPECT_EQ(plain.stats().allocated_bytes.current, static_cast<std::int64_t>(round_request_size(MiB + MiB / 5)));
  plain.free(q);
}
