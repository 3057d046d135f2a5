// Many threads, mixed sizes, cross-stream and cross-thread frees; afterwards the
// allocator's books must balance exactly.

#include "support/host_allocator.hpp"
#include "support/process_status.hpp"
#include "support/sanitized.hpp"

#include <remat/alloc/tags.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

using namespace remat::alloc;
using namespace remat::alloc::testing;
using remat::testing::process_status_mib;

namespace {

constexpr int kThreads = 8;
constexpr int kOpsPerThread = 125'000;  // 1M operations in all
constexpr std::size_t kMaxLivePerThread = 48;

struct Live {
  void* ptr;
  std::size_t size;
};

std::size_t random_size(std::mt19937_64& rng) {
  const std::uint64_t kind = rng() % 100;
  if (kind < 75) return 1 + rng() % (64 * 1024);        // activations and small tensors
  if (kind < 95) return 64 * 1024 + rng() % (8 * MiB);  // mid-sized
  return 8 * MiB + rng() % (24 * MiB);                  // large
}

void check_invariants(const AllocatorSnapshot& snap) {
  std::int64_t reserved = 0;
  std::int64_t allocated = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const SegmentInfo& segment : snap.segments) {
    reserved += static_cast<std::int64_t>(segment.total_size);
    std::uint64_t cursor = segment.address;
    for (const BlockInfo& block : segment.blocks) {
      ASSERT_EQ(block.address, cursor) << "blocks must tile their segment";
      cursor += block.size;
      if (block.state == BlockState::active_allocated) {
        allocated += static_cast<std::int64_t>(block.size);
        ranges.emplace_back(block.address, block.address + block.size);
      }
    }
    ASSERT_EQ(cursor, segment.address + segment.total_size);
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) ASSERT_LE(ranges[i - 1].second, ranges[i].first) << "live blocks overlap";
  EXPECT_EQ(reserved, snap.stats.reserved_bytes.current);
  EXPECT_EQ(allocated, snap.stats.allocated_bytes.current);
  std::int64_t tag_bytes = 0;
  std::int64_t tag_requested = 0;
  std::int64_t tag_count = 0;
  for (const TagStatsEntry& entry : snap.tag_stats) {
    tag_bytes += entry.stats.bytes.current;
    tag_requested += entry.stats.requested_bytes.current;
    tag_count += entry.stats.count.current;
  }
  EXPECT_EQ(tag_bytes, snap.stats.allocated_bytes.current);
  EXPECT_EQ(tag_requested, snap.stats.requested_bytes.current);
  EXPECT_EQ(tag_count, snap.stats.allocations.current);
}

// Eight threads, a million mixed operations, then every figure checked against the segments.
void run_mixed_operations(const std::string& conf) {
  const std::int64_t vm_before = process_status_mib("VmSize");
  const std::int64_t rss_before = process_status_mib("VmRSS");
  HostAllocator a(conf, /*capacity_mb=*/64 * 1024);
  std::mutex handoff_mutex;
  std::vector<Live> handoff;  // blocks one thread allocates and another frees
  std::atomic<std::uint64_t> ops{0};
  std::barrier midpoint(kThreads + 1);
  std::barrier resume(kThreads + 1);

  auto worker = [&](int index) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(index) * 7919 + 1);
    auto region = TagScope::region("thread." + std::to_string(index));
    std::vector<Live> live;
    for (int op = 0; op < kOpsPerThread; ++op) {
      if (op == kOpsPerThread / 2) {
        midpoint.arrive_and_wait();  // main thread checks invariants with blocks live
        resume.arrive_and_wait();
      }
      const std::uint64_t choice = rng() % 100;
      const Stream stream = 1 + rng() % 4;
      auto free_one_of_mine = [&] {
        if (live.empty()) return;
        const std::size_t victim = rng() % live.size();
        a.allocator->deallocate(live[victim].ptr, live[victim].size);
        live[victim] = live.back();
        live.pop_back();
      };
      if (choice < 50) {
        if (live.size() >= kMaxLivePerThread) {
          free_one_of_mine();
        } else {
          std::optional<TagScope> site;
          if (choice < 10) site.emplace(TagScope::site("site." + std::to_string(choice)));
          const std::size_t size = random_size(rng);
          auto* p = static_cast<unsigned char*>(a.alloc(size, stream));
          p[0] = 1;
          p[size - 1] = 2;
          if (choice % 7 == 0) a.allocator->record_stream(p, 1 + (stream % 4));
          live.push_back({p, size});
        }
      } else if (choice < 60) {
        std::lock_guard lock(handoff_mutex);
        if (!live.empty() && handoff.size() < kMaxLivePerThread) {
          handoff.push_back(live.back());
          live.pop_back();
        }
      } else if (choice < 70) {
        std::lock_guard lock(handoff_mutex);
        if (!handoff.empty()) {
          a.allocator->deallocate(handoff.back().ptr, handoff.back().size);
          handoff.pop_back();
        }
      } else {
        free_one_of_mine();
      }
      if (choice == 97) a.host->hold_stream(stream);
      if (choice == 98) a.host->complete_stream(stream);
      if (choice == 99) a.allocator->empty_cache();
      ops.fetch_add(1, std::memory_order_relaxed);
    }
    for (const Live& block : live) a.allocator->deallocate(block.ptr, block.size);
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  midpoint.arrive_and_wait();
  const AllocatorSnapshot mid = a.allocator->snapshot();
  EXPECT_GT(mid.stats.allocations.current, 0);
  check_invariants(mid);
  resume.arrive_and_wait();
  for (auto& t : threads) t.join();
  for (const Live& block : handoff) a.allocator->deallocate(block.ptr, block.size);

  EXPECT_EQ(ops.load(), static_cast<std::uint64_t>(kThreads) * kOpsPerThread);
  for (Stream stream = 1; stream <= 4; ++stream) a.host->complete_stream(stream);
  check_invariants(a.allocator->snapshot());
  a.allocator->empty_cache();  // retires the frees that waited on stream events
  const AllocatorSnapshot end = a.allocator->snapshot();
  check_invariants(end);
  EXPECT_EQ(end.stats.num_ooms, 0u);
  EXPECT_EQ(end.stats.num_invalid_frees, 0u);
  EXPECT_EQ(end.stats.allocated_bytes.current, 0);
  EXPECT_EQ(end.stats.requested_bytes.current, 0);
  EXPECT_EQ(end.stats.active_bytes.current, 0);
  EXPECT_EQ(end.stats.allocations.current, 0);
  EXPECT_EQ(end.stats.reserved_bytes.current, 0);
  EXPECT_EQ(a.host->used_bytes(), 0u);
  // Segments went back to the system: what remains is the threads' own malloc arenas.
  EXPECT_LE(process_status_mib("VmSize") - vm_before, 1024);
  EXPECT_LE(process_status_mib("VmRSS") - rss_before, 256);
}

}  // namespace

TEST(Stress, EightThreadsOneMillionMixedOperationsKeepTheBooksBalanced) { run_mixed_operations("trace_entries:4096"); }

TEST(Stress, TheSameWithExpandableSegments) { run_mixed_operations("trace_entries:4096,expandable_segments:True"); }

// Two threads of training-like churn with tag pushes and pops, then empty_cache: the host
// backend's address space must go back with its segments (from malloc, it kept growing).
TEST(Stress, HostChurnGivesTheAddressSpaceBackAtEmptyCache) {
  constexpr std::size_t kCapacityMb = 4096;
  HostAllocator a("trace_entries:4096", kCapacityMb);
  const std::int64_t vm_before = process_status_mib("VmSize");
  auto worker = [&](int index) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(index) + 11);
    std::vector<Live> live;
    for (int op = 0; op < 150'000; ++op) {
      auto region = TagScope::region("churn." + std::to_string(rng() % 8));
      auto phase = TagScope::phase(op % 2 ? Phase::forward : Phase::backward);
      const std::size_t size = random_size(rng);
      live.push_back({a.alloc(size, static_cast<Stream>(1 + index)), size});
      if (live.size() > kMaxLivePerThread) {
        const std::size_t victim = rng() % live.size();
        a.allocator->deallocate(live[victim].ptr, live[victim].size);
        live[victim] = live.back();
        live.pop_back();
      }
      if (rng() % 500 == 0) a.allocator->empty_cache();
    }
    for (const Live& block : live) a.allocator->deallocate(block.ptr, block.size);
  };
  std::thread one(worker, 0), two(worker, 1);
  one.join();
  two.join();
  a.allocator->empty_cache();
  EXPECT_EQ(a.allocator->stats().reserved_bytes.current, 0);
  const std::int64_t vm_after = process_status_mib("VmSize");
  if (!remat::testing::kSanitized) {  // a sanitizer's shadow maps terabytes of address space
    EXPECT_LE(vm_after, static_cast<std::int64_t>(kCapacityMb) + 2048) << "virtual size after empty_cache, MiB";
  }
  EXPECT_LE(vm_after - vm_before, 512) << "address space kept after empty_cache, MiB";
}
