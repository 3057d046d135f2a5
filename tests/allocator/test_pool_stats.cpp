// The statistics PyTorch's memory_stats() reports, kept by the pool: the small and large pools'
// figures, active and inactive split blocks, oversize blocks and segments, and the two resets.

#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>

#include <gtest/gtest.h>

#include <array>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace remat::alloc;
using namespace remat::alloc::testing;

namespace {

const PoolStats& small_pool(const AllocatorStats& stats) { return stats.pool(PoolKind::small); }
const PoolStats& large_pool(const AllocatorStats& stats) { return stats.pool(PoolKind::large); }

// One figure's four values, as PyTorch reports them (current, peak, allocated, freed).
struct Expected {
  std::int64_t current, peak;
  std::uint64_t added, subtracted;
};
void expect_stat(const Stat& stat, Expected want, const std::string& name) {
  EXPECT_EQ(stat.current, want.current) << name;
  EXPECT_EQ(stat.peak, want.peak) << name;
  EXPECT_EQ(stat.total_added, want.added) << name;
  EXPECT_EQ(stat.total_subtracted(), want.subtracted) << name;
}
// The figure `member` of the whole device, the small pool and the large pool.
void expect_stats(const AllocatorStats& stats, Stat AllocatorStats::*whole, Stat PoolStats::*member,
                  const std::string& name, Expected all, Expected small, Expected large) {
  expect_stat(stats.*whole, all, name + " (whole device)");
  expect_stat(small_pool(stats).*member, small, name + " (small pool)");
  expect_stat(large_pool(stats).*member, large, name + " (large pool)");
}

// Every Stat of the figures, the pools' included, with its name.
std::vector<std::pair<std::string, const Stat*>> every_stat(const AllocatorStats& stats) {
  std::vector<std::pair<std::string, const Stat*>> out = {
      {"allocated_bytes", &stats.allocated_bytes},
      {"requested_bytes", &stats.requested_bytes},
      {"active_bytes", &stats.active_bytes},
      {"reserved_bytes", &stats.reserved_bytes},
      {"allocations", &stats.allocations},
      {"segments", &stats.segments},
      {"active_blocks", &stats.active_blocks},
      {"inactive_split", &stats.inactive_split},
      {"inactive_split_bytes", &stats.inactive_split_bytes},
      {"oversize_allocations", &stats.oversize_allocations},
      {"oversize_segments", &stats.oversize_segments},
  };
  for (PoolKind kind : {PoolKind::small, PoolKind::large}) {
    const PoolStats& pool = stats.pool(kind);
    const std::string prefix = kind == PoolKind::small ? "small." : "large.";
    for (auto [name, stat] : std::initializer_list<std::pair<const char*, const Stat*>>{
             {"allocated_bytes", &pool.allocated_bytes},
             {"requested_bytes", &pool.requested_bytes},
             {"active_bytes", &pool.active_bytes},
             {"reserved_bytes", &pool.reserved_bytes},
             {"inactive_split_bytes", &pool.inactive_split_bytes},
             {"allocations", &pool.allocations},
             {"active_blocks", &pool.active_blocks},
             {"segments", &pool.segments},
             {"inactive_split", &pool.inactive_split}}) {
      out.emplace_back(prefix + name, stat);
    }
  }
  return out;
}

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

// What the snapshot's segments say the current figures of each pool are.
struct Recount {
  std::int64_t allocated_bytes = 0, requested_bytes = 0, active_bytes = 0, reserved_bytes = 0, allocations = 0,
               active_blocks = 0, segments = 0, inactive_split = 0, inactive_split_bytes = 0;
};
std::array<Recount, 2> recount(const CachingAllocator& allocator) {
  std::array<Recount, 2> out;
  for (const SegmentInfo& segment : allocator.snapshot().segments) {
    Recount& pool = out[static_cast<std::size_t>(segment.is_small ? PoolKind::small : PoolKind::large)];
    pool.reserved_bytes += static_cast<std::int64_t>(segment.total_size);
    ++pool.segments;
    for (const BlockInfo& block : segment.blocks) {
      const auto bytes = static_cast<std::int64_t>(block.size);
      if (block.state == BlockState::active_allocated) {
        ++pool.allocations;
        pool.allocated_bytes += bytes;
        pool.requested_bytes += static_cast<std::int64_t>(block.requested_size);
      }
      if (block.state != BlockState::inactive) {
        ++pool.active_blocks;
        pool.active_bytes += bytes;
      }
      if (block.state == BlockState::inactive && segment.blocks.size() > 1) {
        ++pool.inactive_split;
        pool.inactive_split_bytes += bytes;
      }
    }
  }
  return out;
}

// The kept figures of each pool against the recount. In an expandable segment a free block beside
// an unmapped hole shares its segment too, as in PyTorch, but the snapshot shows each mapped run
// as a segment of its own: there segments and inactive split blocks are not recounted.
void expect_recount_matches(const CachingAllocator& allocator, bool expandable) {
  const AllocatorStats stats = allocator.stats();
  const std::array<Recount, 2> counted = recount(allocator);
  for (PoolKind kind : {PoolKind::small, PoolKind::large}) {
    const PoolStats& kept = stats.pool(kind);
    const Recount& pool = counted[static_cast<std::size_t>(kind)];
    const char* name = kind == PoolKind::small ? "small pool" : "large pool";
    EXPECT_EQ(kept.allocated_bytes.current, pool.allocated_bytes) << name;
    EXPECT_EQ(kept.requested_bytes.current, pool.requested_bytes) << name;
    EXPECT_EQ(kept.active_bytes.current, pool.active_bytes) << name;
    EXPECT_EQ(kept.reserved_bytes.current, pool.reserved_bytes) << name;
    EXPECT_EQ(kept.allocations.current, pool.allocations) << name;
    EXPECT_EQ(kept.active_blocks.current, pool.active_blocks) << name;
    if (!expandable) {
      EXPECT_EQ(kept.segments.current, pool.segments) << name;
      EXPECT_EQ(kept.inactive_split.current, pool.inactive_split) << name;
      EXPECT_EQ(kept.inactive_split_bytes.current, pool.inactive_split_bytes) << name;
    }
  }
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

// A scripted run whose every figure is worked out by hand: small blocks split from a 2 MiB
// segment, one freed while another stream still uses it, large blocks split from a 20 MiB
// segment, an oversize block in a segment of its own, an out-of-memory after a retry that gives
// the small segment back, frees that merge, and empty_cache.
TEST(PoolStats, EveryFigureOfAScriptedRunIsExact) {
  constexpr std::uint64_t K = 1024, M = MiB;
  HostAllocator a("max_split_size_mb:22", 64);
  a.allocator->set_oom_reporting(false);
  void* s1 = a.alloc(1000);   // 1 KiB of a new 2 MiB small segment; the rest is split off
  void* s2 = a.alloc(600);    // 1 KiB from that rest, which is split again
  void* l1 = a.alloc(3 * M);  // 3 MiB of a new 20 MiB large segment; 17 MiB split off
  a.allocator->record_stream(s1, 7);
  a.host->hold_stream(7);
  a.free(s1);  // pending on stream 7: no longer allocated, still active
  a.free(s2);  // merges with the free rest; s1 beside it keeps the segment split
  AllocatorStats mid = a.stats();
  EXPECT_EQ(small_pool(mid).allocations.current, 0);
  EXPECT_EQ(small_pool(mid).active_blocks.current, 1);
  EXPECT_EQ(small_pool(mid).active_bytes.current, static_cast<std::int64_t>(K));
  EXPECT_EQ(small_pool(mid).inactive_split_bytes.current, static_cast<std::int64_t>(2 * M - K));
  a.host->complete_stream(7);
  void* l2 = a.alloc(2 * M);    // first retires s1 (the small segment is whole again), then
                                // takes 2 MiB of the 17 MiB free block, splitting off 15 MiB
  void* big = a.alloc(24 * M);  // at least max_split_size: an oversize block and segment
  mid = a.stats();
  EXPECT_EQ(mid.reserved_bytes.current, static_cast<std::int64_t>(46 * M));
  EXPECT_EQ(large_pool(mid).inactive_split_bytes.current, static_cast<std::int64_t>(15 * M));
  EXPECT_EQ(small_pool(mid).inactive_split.current, 0);
  // 30 MiB more does not fit in 64: the retry gives back the free small segment, then fails.
  EXPECT_THROW(a.alloc(30 * M), OutOfMemoryError);
  a.free(big);  // a whole segment: free, but not split
  a.free(l1);   // beside the allocated l2: inactive split
  a.free(l2);   // merges with l1 and the 15 MiB rest: the 20 MiB segment is whole
  a.allocator->empty_cache();

  const AllocatorStats stats = a.stats();
  auto same = [](std::int64_t peak, std::uint64_t total) { return Expected{0, peak, total, total}; };
  auto i = [](std::uint64_t bytes) { return static_cast<std::int64_t>(bytes); };
  expect_stats(stats, &AllocatorStats::allocated_bytes, &PoolStats::allocated_bytes, "allocated_bytes",
               same(i(29 * M), 29 * M + 2 * K), same(i(2 * K), 2 * K), same(i(29 * M), 29 * M));
  expect_stats(stats, &AllocatorStats::requested_bytes, &PoolStats::requested_bytes, "requested_bytes",
               same(i(29 * M), 29 * M + 1600), same(1600, 1600), same(i(29 * M), 29 * M));
  expect_stats(stats, &AllocatorStats::active_bytes, &PoolStats::active_bytes, "active_bytes",
               same(i(29 * M), 29 * M + 2 * K), same(i(2 * K), 2 * K), same(i(29 * M), 29 * M));
  // Reserved: 2 MiB small, then 20 and 24 MiB large (46 in all before the retry).
  expect_stats(stats, &AllocatorStats::reserved_bytes, &PoolStats::reserved_bytes, "reserved_bytes",
               same(i(46 * M), 46 * M), same(i(2 * M), 2 * M), same(i(44 * M), 44 * M));
  expect_stats(stats, &AllocatorStats::allocations, &PoolStats::allocations, "allocations", same(3, 5), same(2, 2),
               same(3, 3));
  // s1 stays active while pending, so the small pool had two active blocks at once.
  expect_stats(stats, &AllocatorStats::active_blocks, &PoolStats::active_blocks, "active_blocks", same(3, 5),
               same(2, 2), same(3, 3));
  expect_stats(stats, &AllocatorStats::segments, &PoolStats::segments, "segments", same(3, 3), same(1, 1), same(2, 2));
  // Small: the rest after s1 (2M-1K), after s2 (2M-2K), then s2 merged with it (2M-1K), one at
  // a time. Large: 17 MiB, then 15 MiB, then l1 (3 MiB) beside the 15 MiB: two, 18 MiB.
  // The whole device's peak: 2M-1K small with 17 MiB large.
  expect_stats(stats, &AllocatorStats::inactive_split, &PoolStats::inactive_split, "inactive_split", same(2, 6),
               same(1, 3), same(2, 3));
  expect_stats(stats, &AllocatorStats::inactive_split_bytes, &PoolStats::inactive_split_bytes, "inactive_split_bytes",
               same(i(19 * M - K), 41 * M - 4 * K), same(i(2 * M - K), 6 * M - 4 * K), same(i(18 * M), 35 * M));
  expect_stat(stats.oversize_allocations, same(1, 1), "oversize_allocations");
  expect_stat(stats.oversize_segments, same(1, 1), "oversize_segments");
  EXPECT_EQ(stats.num_ooms, 1u);
  EXPECT_EQ(stats.num_alloc_retries, 1u);
  EXPECT_EQ(stats.num_sync_all_streams, 1u);
  EXPECT_EQ(stats.num_invalid_frees, 0u);
  expect_pools_add_up(stats);
}

TEST(PoolStats, ResetPeakSetsEveryPeakToItsCurrentFigureInBothPools) {
  HostAllocator a("max_split_size_mb:22", 64);
  void* small = a.alloc(4096);
  void* large = a.alloc(8 * MiB);
  void* oversize = a.alloc(24 * MiB);
  a.free(large);
  a.free(oversize);
  a.allocator->reset_peak_stats();
  const AllocatorStats stats = a.stats();
  for (const auto& [name, stat] : every_stat(stats)) EXPECT_EQ(stat->peak, stat->current) << name;
  EXPECT_EQ(small_pool(stats).allocated_bytes.peak, 4096);
  EXPECT_EQ(large_pool(stats).reserved_bytes.peak, static_cast<std::int64_t>(44 * MiB));
  EXPECT_EQ(large_pool(stats).inactive_split.peak, 0);  // both large segments are whole again
  EXPECT_EQ(stats.oversize_segments.peak, 1);
  // The small pool's peak rises again from its figure at the reset, not from zero.
  void* more = a.alloc(4096);
  EXPECT_EQ(small_pool(a.stats()).allocated_bytes.peak, 8192);
  a.free(more);
  a.free(small);
}

TEST(PoolStats, ResetAccumulatedZeroesEveryTotalAndCountsOnlyWhatFollows) {
  HostAllocator a("", 64);
  a.allocator->set_oom_reporting(false);
  void* small = a.alloc(4096);
  void* large = a.alloc(8 * MiB);
  void* gone = a.alloc(3 * MiB);
  a.free(gone);
  EXPECT_THROW(a.alloc(100 * MiB), OutOfMemoryError);
  EXPECT_THROW(a.allocator->deallocate(gone), InvalidPointerError);
  const AllocatorStats before = a.stats();
  a.allocator->reset_accumulated_stats();
  AllocatorStats stats = a.stats();
  const auto before_stats = every_stat(before);
  const auto after_stats = every_stat(stats);
  for (std::size_t k = 0; k < after_stats.size(); ++k) {
    const std::string& name = after_stats[k].first;
    EXPECT_EQ(after_stats[k].second->total_added, 0u) << name;
    EXPECT_EQ(after_stats[k].second->total_subtracted(), 0u) << name;
    EXPECT_EQ(after_stats[k].second->current, before_stats[k].second->current) << name;
    EXPECT_EQ(after_stats[k].second->peak, before_stats[k].second->peak) << name;
  }
  EXPECT_EQ(stats.num_ooms, 0u);
  EXPECT_EQ(stats.num_alloc_retries, 0u);
  EXPECT_EQ(stats.num_sync_all_streams, 0u);
  EXPECT_EQ(stats.num_invalid_frees, 1u);  // PyTorch keeps no such count, so none to reset
  a.free(large);
  a.free(small);
  stats = a.stats();
  expect_stat(large_pool(stats).allocated_bytes, {0, static_cast<std::int64_t>(11 * MiB), 0, 8 * MiB},
              "large allocated_bytes");
  expect_stat(small_pool(stats).allocations, {0, 1, 0, 1}, "small allocations");
  expect_stat(stats.allocations, {0, 3, 0, 2}, "allocations");
  expect_pools_add_up(stats);
}

TEST(PoolStats, FiguresMatchARecountOfTheSegmentsAfterRandomWork) {
  for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:24"}) {
    SCOPED_TRACE(conf);
    const bool expandable = std::string(conf).starts_with("expandable");
    HostAllocator a(conf, 512);
    a.allocator->set_oom_reporting(false);
    std::mt19937 rng(1234);
    std::vector<void*> live;
    bool holding = false;  // stream 5 holds its events: frees of blocks it used stay pending
    for (int step = 0; step < 3000; ++step) {
      const bool grow = live.empty() || rng() % 100 < 52;
      if (grow) {
        const std::size_t sizes[] = {512, 3000, 700 * 1024, 1 * MiB + 1, 3 * MiB, 11 * MiB, 30 * MiB};
        try {
          void* p = a.alloc(sizes[rng() % std::size(sizes)] + rng() % 4096, rng() % 4 == 0 ? 3 : 0);
          if (rng() % 8 == 0) a.allocator->record_stream(p, 5);
          live.push_back(p);
        } catch (const OutOfMemoryError&) {
        }
      } else {
        const std::size_t at = rng() % live.size();
        a.free(live[at]);
        live[at] = live.back();
        live.pop_back();
      }
      if (step % 37 == 0) {
        if (holding)
          a.host->complete_stream(5);
        else
          a.host->hold_stream(5);
        holding = !holding;
      }
      if (step % 500 == 250) a.allocator->empty_cache();
      if (step % 100 == 0) {
        SCOPED_TRACE("step " + std::to_string(step));
        expect_pools_add_up(a.stats());
        expect_recount_matches(*a.allocator, expandable);
        if (::testing::Test::HasFailure()) return;
      }
    }
    if (holding) a.host->complete_stream(5);
    for (void* p : live) a.free(p);
    a.allocator->empty_cache();
    const AllocatorStats stats = a.stats();
    for (const auto& [name, stat] : every_stat(stats)) {
      EXPECT_EQ(stat->current, 0) << name;
      EXPECT_EQ(stat->total_added, stat->total_subtracted()) << name;
    }
    expect_pools_add_up(stats);
  }
}

}  // namespace
