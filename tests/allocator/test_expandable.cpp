// PyTorch's expandable segments, garbage_collection_threshold, max_non_split_rounding_mb and
// large_segment_size_mb on the host backend, which maps and unmaps 2 MiB granules of a
// reservation as CUDA's virtual memory API does on a device.

#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace remat::alloc;
using namespace remat::alloc::testing;

namespace {

constexpr const char* kExpandable = "expandable_segments:True";

std::int64_t mib(std::size_t n) { return static_cast<std::int64_t>(n * MiB); }

const SegmentInfo& only_segment(const AllocatorSnapshot& snap) {
  EXPECT_EQ(snap.segments.size(), 1u);
  return snap.segments.at(0);
}

}  // namespace

TEST(ExpandableSegments, GrowAtTheirEndInLargeSegmentSteps) {
  HostAllocator a(kExpandable);
  void* first = a.alloc(30 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(40));  // one 20 MiB step more than fits
  void* second = a.alloc(15 * MiB);                       // the 10 MiB tail grows by one step
  EXPECT_EQ(addr(second), addr(first) + 30 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(60));
  EXPECT_EQ(a.stats().segments.current, 1);
  EXPECT_EQ(a.host->used_bytes(), 60 * MiB);

  const AllocatorSnapshot snap = a.allocator->snapshot();
  const SegmentInfo& segment = only_segment(snap);
  EXPECT_TRUE(segment.is_expandable);
  EXPECT_EQ(segment.address, addr(first));
  EXPECT_EQ(segment.total_size, 60 * MiB);
  ASSERT_EQ(segment.blocks.size(), 3u);
  EXPECT_EQ(segment.blocks[2].size, 15 * MiB);  // the free rest of the mapped range
  EXPECT_EQ(segment.blocks[2].state, BlockState::inactive);
  a.free(first);
  a.free(second);
}

TEST(ExpandableSegments, ReserveLessThanFixedSegmentsWhenSizesVary) {
  // Requests that grow step by step (a sequence length going up) leave a fixed segment
  // behind each time; one expandable segment reuses its freed start and grows its end.
  auto peak_reserved = [](const std::string& conf) {
    HostAllocator a(conf);
    for (std::size_t size = 12; size <= 60; size += 4) a.free(a.alloc(size * MiB));
    return a.stats().reserved_bytes.peak;
  };
  EXPECT_EQ(peak_reserved(""), mib(12 + 16 + 20 + 24 + 28 + 32 + 36 + 40 + 44 + 48 + 52 + 56 + 60));
  EXPECT_EQ(peak_reserved(kExpandable), mib(60));
}

TEST(ExpandableSegments, FreedBlocksAreReusedWithoutGrowing) {
  HostAllocator a(kExpandable);
  void* first = a.alloc(30 * MiB);
  void* second = a.alloc(8 * MiB);
  a.free(first);
  void* again = a.alloc(25 * MiB);
  EXPECT_EQ(again, first);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(40));
  // Small requests have their own segment, grown 2 MiB at a time.
  void* smalls[6];
  for (void*& p : smalls) p = a.alloc(1 * MiB);
  for (int i = 1; i < 6; ++i) EXPECT_EQ(addr(smalls[i]), addr(smalls[i - 1]) + 1 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(40 + 6));
  for (void* p : smalls) a.free(p);
  void* reused = a.alloc(700 * 1024);  // from the 6 MiB free block, past the small bins' 2 MiB
  EXPECT_EQ(reused, smalls[0]);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(40 + 6));
  a.free(reused);
  a.free(second);
  a.free(again);
}

TEST(ExpandableSegments, EachStreamHasItsOwnSegment) {
  HostAllocator a(kExpandable);
  void* on_one = a.alloc(30 * MiB, 1);
  void* on_two = a.alloc(30 * MiB, 2);
  const AllocatorSnapshot snap = a.allocator->snapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  EXPECT_NE(snap.segments[0].stream, snap.segments[1].stream);
  a.free(on_one);
  a.free(on_two);
}

TEST(ExpandableSegments, EmptyCacheUnmapsTheFreeTailAndThenTheReservation) {
  HostAllocator a(kExpandable);
  void* kept = a.alloc(31 * MiB);
  void* tail = a.alloc(40 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(80));
  a.free(tail);
  a.allocator->empty_cache();
  // Whole granules after the live block go back: 31 MiB rounds up to 32 MiB kept.
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(32));
  EXPECT_EQ(a.host->used_bytes(), 32 * MiB);
  EXPECT_EQ(only_segment(a.allocator->snapshot()).total_size, 32 * MiB);
  void* grown = a.alloc(30 * MiB);  // grows again from the kept end
  EXPECT_EQ(addr(grown), addr(kept) + 31 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(72));
  a.free(grown);
  a.free(kept);
  a.allocator->empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.stats().segments.current, 0);
  EXPECT_EQ(a.host->used_bytes(), 0u);
  EXPECT_TRUE(a.allocator->snapshot().segments.empty());
}

TEST(ExpandableSegments, MemoryIsReallyUsable) {
  HostAllocator a(kExpandable);
  auto* big = static_cast<unsigned char*>(a.alloc(50 * MiB));
  auto* small = static_cast<unsigned char*>(a.alloc(4096));
  std::memset(big, 0xab, 50 * MiB);
  std::memset(small, 0xcd, 4096);
  EXPECT_EQ(big[50 * MiB - 1], 0xab);
  EXPECT_EQ(small[4095], 0xcd);
  a.free(big);
  a.free(small);
  a.allocator->empty_cache();
  auto* again = static_cast<unsigned char*>(a.alloc(50 * MiB));  // freshly mapped pages read as zero
  EXPECT_EQ(again[0], 0);
  a.free(again);
}

TEST(ExpandableSegments, OutOfMemoryWhenTheRangeCannotGrow) {
  HostAllocator a(kExpandable, /*capacity_mb=*/64);
  void* first = a.alloc(40 * MiB);
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);  // would map 40 MiB more: 80 > 64
  EXPECT_EQ(a.stats().num_ooms, 1u);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(40));
  a.free(first);
  void* fits = a.alloc(30 * MiB);  // the pool is intact: the freed range serves it
  EXPECT_EQ(fits, first);
  a.free(fits);

  HostAllocator capped("expandable_segments:True,memory_fraction:0.5", 100);
  void* held = capped.alloc(40 * MiB);
  EXPECT_THROW(capped.alloc(20 * MiB), OutOfMemoryError);  // 60 MiB would pass the 50 MiB cap
  capped.free(held);
}

TEST(ExpandableSegments, CanBeSwitchedOnAndOffOnALiveAllocator) {
  HostAllocator a;
  void* fixed = a.alloc(30 * MiB);
  a.allocator->apply_config(Config::parse(kExpandable, Config{}));
  void* grown = a.alloc(30 * MiB);
  AllocatorSnapshot snap = a.allocator->snapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  EXPECT_NE(snap.segments[0].is_expandable, snap.segments[1].is_expandable);
  a.allocator->apply_config(Config{});
  a.free(grown);
  a.free(fixed);
  a.allocator->empty_cache();
  EXPECT_EQ(a.host->used_bytes(), 0u);
}

TEST(ExpandableSegments, ABackendThatCannotMapIsRefusedByName) {
  class FixedOnly final : public Backend {
   public:
    std::string_view name() const override { return "fixed-only"; }
    int device() const override { return 0; }
    void* allocate(std::size_t) override { return nullptr; }
    void deallocate(void*, std::size_t) override {}
    DeviceMemoryInfo memory_info() override { return {0, 0}; }
    Event record_event(Stream) override { return nullptr; }
    bool event_completed(Event) override { return true; }
    bool wait_event(Event) override { return true; }
    void destroy_event(Event) override {}
  };
  try {
    CachingAllocator allocator(std::make_unique<FixedOnly>(), Config::parse(kExpandable, Config{}));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the fixed-only backend cannot: set expandable_segments:False"),
              std::string::npos);
  }
}

TEST(LargeSegmentSize, SizesTheSegmentMidSizedRequestsShare) {
  HostAllocator a("large_segment_size_mb:40");
  void* p = a.alloc(5 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(40));
  void* q = a.alloc(9 * MiB);  // shares it
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(40));
  void* big = a.alloc(30 * MiB);  // 10 MiB and up: its own segment, as before
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(70));
  a.free(p);
  a.free(q);
  a.free(big);
  HostAllocator grown("large_segment_size_mb:40,expandable_segments:True");
  void* r = grown.alloc(41 * MiB);
  EXPECT_EQ(grown.stats().reserved_bytes.current, mib(80));  // growth in 40 MiB steps
  grown.free(r);
}

TEST(MaxNonSplitRounding, BoundsHowMuchLargerAnUnsplitBlockMayBe) {
  auto reserved_after = [](const std::string& conf) {
    HostAllocator a("max_split_size_mb:40" + conf);
    a.free(a.alloc(120 * MiB));
    void* p = a.alloc(90 * MiB);  // >= max_split_size: may take the cached 120 MiB block whole
    const std::int64_t reserved = a.stats().reserved_bytes.current;
    a.free(p);
    return reserved;
  };
  // 120 >= 90 + 20: the default refuses the block and maps a new segment.
  EXPECT_EQ(reserved_after(""), mib(120 + 90));
  // 120 < 90 + 40: the block is taken, unsplit.
  EXPECT_EQ(reserved_after(",max_non_split_rounding_mb:40"), mib(120));
}

TEST(GarbageCollectionThreshold, FreesTheLongestIdleSegmentsPastTheThreshold) {
  // Cap 100 MiB (memory_fraction 0.5 of 200), threshold 50 MiB.
  auto run = [](const std::string& conf) {
    HostAllocator a(conf, 200);
    void* older = a.alloc(30 * MiB);
    void* newer = a.alloc(30 * MiB);
    a.free(older);
    a.free(newer);
    void* p = a.alloc(40 * MiB);  // no cached block fits
    const AllocatorSnapshot snap = a.allocator->snapshot();
    a.free(p);
    return snap;
  };
  const AllocatorSnapshot collected = run("memory_fraction:0.5,garbage_collection_threshold:0.5");
  // 60 MiB reserved > 50: the first segment freed goes, which brings reserved under 50.
  EXPECT_EQ(collected.stats.reserved_bytes.current, mib(30 + 40));
  ASSERT_EQ(collected.segments.size(), 2u);
  EXPECT_EQ(collected.stats.num_alloc_retries, 0u);
  const AllocatorSnapshot kept = run("memory_fraction:0.5");
  EXPECT_EQ(kept.stats.reserved_bytes.current, mib(100));
  // As PyTorch: without a memory_fraction cap the threshold has nothing to be a share of.
  EXPECT_EQ(run("garbage_collection_threshold:0.5").stats.reserved_bytes.current, mib(100));
}

TEST(GarbageCollectionThreshold, UnmapsIdleExpandableTails) {
  HostAllocator a("memory_fraction:0.5,garbage_collection_threshold:0.5,expandable_segments:True", 200);
  void* on_one = a.alloc(60 * MiB, 1);  // 60 MiB mapped on stream 1
  a.free(on_one);
  void* on_two = a.alloc(30 * MiB, 2);  // stream 2 finds nothing cached: GC unmaps stream 1's tail first
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(40));
  a.free(on_two);
}

TEST(ExpandableSegments, UnmapFreePagesInTheirMiddleBeforeGivingUp) {
  // 100 MiB freed at the segment's start, below a live block: the pool does not hand it to a
  // 30 MiB request (max_split_size), and growing the end would pass the 140 MiB device. The
  // retry unmaps the free pages in the middle and maps the request's there.
  HostAllocator a("expandable_segments:True,max_split_size_mb:48", 140);
  void* front = a.alloc(100 * MiB);
  void* live = a.alloc(20 * MiB);
  a.free(front);
  void* request = a.alloc(30 * MiB);
  EXPECT_EQ(request, front);
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  EXPECT_EQ(a.stats().num_ooms, 0u);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(60));  // 40 MiB mapped in the hole, 20 MiB live
  EXPECT_EQ(a.host->used_bytes(), 60 * MiB);
  // The snapshot shows the mapped runs on either side of the remaining hole, as PyTorch does.
  const AllocatorSnapshot snap = a.allocator->snapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  EXPECT_EQ(snap.segments[0].address, addr(front));
  EXPECT_EQ(snap.segments[0].total_size, 40 * MiB);
  EXPECT_EQ(snap.segments[1].address, addr(live));
  EXPECT_EQ(snap.segments[1].total_size, 20 * MiB);
  EXPECT_EQ(a.stats().segments.current, 1);
  // The hole fills again, joining the mapped runs: one 120 MiB segment.
  void* more = a.alloc(60 * MiB);
  EXPECT_EQ(addr(more), addr(front) + 30 * MiB);
  EXPECT_EQ(a.allocator->snapshot().segments.size(), 1u);
  EXPECT_EQ(a.stats().reserved_bytes.current, mib(120));
  a.free(request);
  a.free(more);
  a.free(live);
  a.allocator->empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.stats().segments.current, 0);
  EXPECT_EQ(a.host->used_bytes(), 0u);
}

TEST(ExpandableSegments, EmptyCacheUnmapsFreePagesBetweenLiveBlocks) {
  HostAllocator a(kExpandable);
  void* first = a.alloc(10 * MiB);
  void* middle = a.alloc(50 * MiB);
  void* last = a.alloc(10 * MiB);
  a.free(middle);
  a.allocator->empty_cache();
  // The 50 MiB block lies from 10 to 60 MiB: granules 10-60 go back, nothing live is touched.
  EXPECT_EQ(a.host->used_bytes(), 20 * MiB);
  std::memset(first, 1, 10 * MiB);
  std::memset(last, 2, 10 * MiB);
  a.free(first);
  a.free(last);
  a.allocator->empty_cache();
  EXPECT_EQ(a.host->used_bytes(), 0u);
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
}

namespace {

// Random sizes from 1 B to 70 MB (half uniform, half log-uniform), up to 60 blocks live, on an
// 8 GiB host device; counts the requests refused.
std::uint64_t out_of_memory_errors(const std::string& conf, std::uint64_t seed, int steps) {
  HostAllocator a(conf, 8192);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(0.0, std::log(70e6));
  std::uniform_int_distribution<std::size_t> uniform_size(1, 70'000'000);
  std::vector<void*> live;
  std::uint64_t refused = 0;
  for (int step = 0; step < steps; ++step) {
    if (live.size() < 60 && (live.empty() || rng() % 2 == 0)) {
      const std::size_t size =
          rng() % 2 == 0 ? uniform_size(rng) : static_cast<std::size_t>(std::exp(log_size(rng)));
      try {
        live.push_back(a.alloc(std::max<std::size_t>(size, 1)));
      } catch (const OutOfMemoryError&) {
        ++refused;
      }
    } else {
      const std::size_t victim = rng() % live.size();
      a.free(live[victim]);
      live[victim] = live.back();
      live.pop_back();
    }
  }
  EXPECT_LE(a.stats().reserved_bytes.peak, mib(8192));
  for (void* p : live) a.free(p);
  a.allocator->empty_cache();
  EXPECT_EQ(a.host->used_bytes(), 0u) << conf;
  return refused;
}

}  // namespace

TEST(ExpandableSegments, WithMaxSplitSizeNeverRunOutWithMostMemoryFree) {
  // At most 60 blocks of 70 MB live: 4.2 GB at most on an 8 GiB device, so no request may fail.
  for (const char* conf : {"expandable_segments:True,max_split_size_mb:48", "expandable_segments:True",
                           "max_split_size_mb:48",
                           "expandable_segments:True,max_split_size_mb:48,roundup_power2_divisions:4",
                           "expandable_segments:True,max_split_size_mb:48,memory_fraction:0.9,"
                           "garbage_collection_threshold:0.6",
                           "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:[256:1,>:8],"
                           "memory_fraction:0.8,garbage_collection_threshold:0.5"}) {
    for (const std::uint64_t seed : {9u, 1u, 2u}) {
      EXPECT_EQ(out_of_memory_errors(conf, seed, 4000), 0u) << conf << " seed " << seed;
    }
  }
}
