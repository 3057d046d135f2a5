// The statistics PyTorch's memory_stats() reports, kept by the pool: the small and large pools'
// figures, active and inactive split blocks, oversize blocks and segments, and the two resets.

#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

using namespace remat::alloc;
using namespace remat::alloc::testing;

namespace {

const PoolStats& small_pool(const AllocatorStats& stats) { return stats.pool(PoolKind::small); }
const PoolStats& large_pool(const AllocatorStats& stats) { return stats.pool(PoolKind::large); }

// Every whole-device figure is the sum of the two pools' (current and both totals).
void expect_pools_add_up(const AllocatorStats& stats) {
  auto check = [&](const Stat& whole, Stat PoolStats::*member, const char* name) {
    const Stat& small = small_pool(stats).*member;
    const Stat& large = large_pool(stats).*member;
    EXPECT_EQ(whole.current, small.current + large.current) << name;
    EXPECT_EQ(whole.total_added, small.total_added + large.total_added) << name;
    EXPECT_EQ(whole.total_subtracted(), small.total_subtracted() + large.total_subtracted()) << name;
  };
  check(stats.allocated_bytes, &PoolStats::allocated_bytes, "allocated_bytes");
  check(stats.requested_bytes, &PoolStats::requested_bytes, "requested_bytes");
  check(stats.active_bytes, &PoolStats::active_bytes, "active_bytes");
  check(stats.reserved_bytes, &PoolStats::reserved_bytes, "reserved_bytes");
  check(stats.inactive_split_bytes, &PoolStats::inactive_split_bytes, "inactive_split_bytes");
  check(stats.allocations, &PoolStats::allocations, "allocations");
  check(stats.active_blocks, &PoolStats::active_blocks, "active_blocks");
  check(stats.segments, &PoolStats::segments, "segments");
  check(stats.inactive_split, &PoolStats::inactive_split, "inactive_split");
}

// What the snapshot's segments say the current figures are.
struct Recount {
  std::int64_t active_blocks = 0, inactive_split = 0, inactive_split_bytes = 0, small_reserved = 0;
};
Recount recount(const CachingAllocator& allocator) {
  Recount out;
  for (const SegmentInfo& segment : allocator.snapshot().segments) {
    if (segment.is_small) out.small_reserved += static_cast<std::int64_t>(segment.total_size);
    for (const BlockInfo& block : segment.blocks) {
      if (block.state != BlockState::inactive) ++out.active_blocks;
      if (block.state == BlockState::inactive && segment.blocks.size() > 1) {
        ++out.inactive_split;
        out.inactive_split_bytes += static_cast<std::int64_t>(block.size);
      }
    }
  }
  return out;
}

TEST(PoolStats, SmallAndLargeBlocksAreCountedInTheirOwnPools) {
  HostAllocator a;
  void* s1 = a.alloc(1000);  // 1024 in a new 2 MiB small segment
  void* s2 = a.alloc(600);   // 1024 beside it
  void* l1 = a.alloc(3 * MiB);
  AllocatorStats stats = a.stats();
  EXPECT_EQ(small_pool(stats).allocated_bytes.current, 2048);
  EXPECT_EQ(small_pool(stats).requested_bytes.current, 1600);
  EXPECT_EQ(small_pool(stats).reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(small_pool(stats).segments.current, 1);
  EXPECT_EQ(large_pool(stats).allocated_bytes.current, static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(large_pool(stats).reserved_bytes.current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(stats.active_blocks.current, 3);
  // The small segment's free rest and the large one's are free blocks beside allocated ones.
  EXPECT_EQ(small_pool(stats).inactive_split.current, 1);
  EXPECT_EQ(small_pool(stats).inactive_split_bytes.current, static_cast<std::int64_t>(2 * MiB - 2048));
  EXPECT_EQ(large_pool(stats).inactive_split_bytes.current, static_cast<std::int64_t>(17 * MiB));

  a.free(s1);  // a free block between the segment's start and s2: split, inactive
  stats = a.stats();
  EXPECT_EQ(small_pool(stats).inactive_split.current, 2);
  EXPECT_EQ(small_pool(stats).allocated_bytes.total_subtracted(), 1024u);
  a.free(s2);  // merges with both free neighbours: the whole segment, no longer split
  a.free(l1);
  stats = a.stats();
  EXPECT_EQ(stats.inactive_split.current, 0);
  EXPECT_EQ(stats.inactive_split_bytes.current, 0);
  EXPECT_EQ(stats.inactive_split.peak, 3);
  EXPECT_EQ(stats.active_blocks.current, 0);
  EXPECT_EQ(stats.active_blocks.total_added, 3u);
  EXPECT_EQ(stats.active_blocks.total_subtracted(), 3u);
  expect_pools_add_up(stats);

  a.allocator->empty_cache();
  stats = a.stats();
  EXPECT_EQ(small_pool(stats).segments.total_subtracted(), 1u);
  EXPECT_EQ(large_pool(stats).reserved_bytes.total_subtracted(), 20 * MiB);
}

TEST(PoolStats, ABlockFreedOnAnotherStreamStaysActiveUntilThatStreamIsDone) {
  HostAllocator a;
  void* p = a.alloc(4096);
  a.allocator->record_stream(p, 7);
  a.host->hold_stream(7);
  a.free(p);
  AllocatorStats stats = a.stats();
  EXPECT_EQ(stats.allocations.current, 0);
  EXPECT_EQ(stats.active_blocks.current, 1);
  EXPECT_EQ(small_pool(stats).active_bytes.current, 4096);
  a.host->complete_stream(7);
  a.alloc(512);  // retires completed frees
  stats = a.stats();
  EXPECT_EQ(stats.active_blocks.current, 1);  // the new block only
  EXPECT_EQ(small_pool(stats).active_bytes.current, 512);
  EXPECT_EQ(small_pool(stats).active_blocks.total_subtracted(), 1u);
}

TEST(PoolStats, OversizeBlocksAndSegmentsAreThoseOfAtLeastMaxSplitSize) {
  HostAllocator a("max_split_size_mb:22");
  void* big = a.alloc(24 * MiB);
  void* under = a.alloc(8 * MiB);
  AllocatorStats stats = a.stats();
  EXPECT_EQ(stats.oversize_allocations.current, 1);
  EXPECT_EQ(stats.oversize_segments.current, 1);
  a.free(big);
  a.free(under);
  a.allocator->empty_cache();
  stats = a.stats();
  EXPECT_EQ(stats.oversize_allocations.current, 0);
  EXPECT_EQ(stats.oversize_allocations.total_added, 1u);
  EXPECT_EQ(stats.oversize_segments.current, 0);
  EXPECT_EQ(stats.oversize_segments.total_subtracted(), 1u);
}

TEST(PoolStats, ResetsTouchPeaksOrTotalsAndLeaveCurrentFiguresAlone) {
  HostAllocator a("", 64);
  void* p = a.alloc(8 * MiB);
  void* q = a.alloc(1 * MiB);  // the small pool's largest block
  a.allocator->set_oom_reporting(false);
  EXPECT_THROW(a.alloc(200 * MiB), OutOfMemoryError);
  a.free(p);
  a.allocator->reset_peak_stats();
  AllocatorStats stats = a.stats();
  EXPECT_EQ(stats.allocated_bytes.peak, static_cast<std::int64_t>(1 * MiB));
  EXPECT_EQ(small_pool(stats).allocated_bytes.peak, static_cast<std::int64_t>(1 * MiB));
  EXPECT_EQ(large_pool(stats).allocated_bytes.peak, 0);
  EXPECT_EQ(stats.active_blocks.peak, 1);
  EXPECT_EQ(stats.num_ooms, 1u);
  EXPECT_EQ(stats.num_alloc_retries, 1u);

  a.allocator->reset_accumulated_stats();
  stats = a.stats();
  EXPECT_EQ(stats.allocations.total_added, 0u);
  EXPECT_EQ(stats.allocations.total_subtracted(), 0u);
  EXPECT_EQ(large_pool(stats).reserved_bytes.total_added, 0u);
  EXPECT_EQ(stats.num_ooms, 0u);
  EXPECT_EQ(stats.num_alloc_retries, 0u);
  EXPECT_EQ(stats.allocations.current, 1);
  EXPECT_EQ(stats.allocated_bytes.current, static_cast<std::int64_t>(1 * MiB));
  a.free(q);
  EXPECT_EQ(a.stats().allocations.total_subtracted(), 1u);
}

// In an expandable segment a free block beside an unmapped hole shares its segment too, as in
// PyTorch; the snapshot shows each mapped run as a segment of its own, so there the recount of
// inactive split blocks is left out.
TEST(PoolStats, FiguresMatchARecountOfTheSegmentsAfterRandomWork) {
  for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:24"}) {
    SCOPED_TRACE(conf);
    const bool expandable = std::string(conf).starts_with("expandable");
    HostAllocator a(conf, 512);
    a.allocator->set_oom_reporting(false);
    std::mt19937 rng(1234);
    std::vector<void*> live;
    for (int step = 0; step < 3000; ++step) {
      const bool grow = live.empty() || rng() % 100 < 52;
      if (grow) {
        const std::size_t sizes[] = {512, 3000, 700 * 1024, 1 * MiB + 1, 3 * MiB, 11 * MiB, 30 * MiB};
        try {
          live.push_back(a.alloc(sizes[rng() % std::size(sizes)] + rng() % 4096));
        } catch (const OutOfMemoryError&) {
        }
      } else {
        const std::size_t at = rng() % live.size();
        a.free(live[at]);
        live[at] = live.back();
        live.pop_back();
      }
      if (step % 500 == 250) a.allocator->empty_cache();
      if (step % 100 == 0) {
        const AllocatorStats stats = a.stats();
        expect_pools_add_up(stats);
        const Recount counted = recount(*a.allocator);
        ASSERT_EQ(stats.active_blocks.current, counted.active_blocks) << "step " << step;
        if (!expandable) {
          ASSERT_EQ(stats.inactive_split.current, counted.inactive_split) << "step " << step;
          ASSERT_EQ(stats.inactive_split_bytes.current, counted.inactive_split_bytes) << "step " << step;
        }
        ASSERT_EQ(small_pool(stats).reserved_bytes.current, counted.small_reserved) << "step " << step;
      }
    }
    for (void* p : live) a.free(p);
    a.allocator->empty_cache();
    const AllocatorStats stats = a.stats();
    EXPECT_EQ(stats.inactive_split.current, 0);
    EXPECT_EQ(stats.reserved_bytes.current, 0);
    expect_pools_add_up(stats);
  }
}

}  // namespace
