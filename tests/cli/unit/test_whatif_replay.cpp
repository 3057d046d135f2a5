// The what-if replay against the allocator it imitates: workloads recorded with the caching pool
// on the host backend, written as JSON Lines traces, replayed under the recorded settings, give
// the recorded peaks exactly; other settings give the figures they should.

#include "analysis/whatif_replay.hpp"
#include "reader/dump_file.hpp"
#include "reader/trace_file.hpp"

#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/config.hpp>
#include <remat/alloc/host_backend.hpp>
#include <remat/alloc/snapshot.hpp>
#include <remat/alloc/tags.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

namespace remat::report {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kHostCapacity = std::size_t{8} << 30;

using Workload = std::function<void(alloc::CachingAllocator&)>;

struct Recording {
  alloc::AllocatorStats stats;
  std::string trace_path;
};

alloc::Config config_of(const std::string& text) {
  return alloc::Config::parse(text, alloc::Config{}, "test");
}

// Runs `workload` on a fresh pool over host memory with a trace ring large enough to keep every
// event, and writes its trace.
Recording record(const alloc::Config& config, const Workload& workload, const std::string& name) {
  alloc::Config recorded = config;
  recorded.trace_entries = std::size_t{1} << 22;
  alloc::CachingAllocator allocator(std::make_unique<alloc::HostBackend>(kHostCapacity), recorded);
  workload(allocator);
  Recording out;
  out.stats = allocator.stats();
  out.trace_path = (std::filesystem::temp_directory_path() / ("remat-whatif-" + name + ".jsonl")).string();
  std::ofstream(out.trace_path) << alloc::trace_to_jsonl(allocator.snapshot());
  return out;
}

struct Replayed {
  std::vector<WhatIfRun> runs;
  WhatIfCounts counts;
};

Replayed replay(const std::string& path, const std::vector<alloc::Config>& configs,
                std::uint64_t capacity = std::uint64_t{1} << 50) {
  const DumpFile dump = open_dump(path);
  TraceFile trace(dump);
  WhatIfReplay replay(configs, capacity, 0, trace.header().tags);
  trace.stream(replay);
  return {replay.results(), replay.counts()};
}

// A training-like loop: parameters once, then steps whose activations depend on a sequence
// length that changes between steps, freed in reverse in backward, with temporaries.
void training(alloc::CachingAllocator& a, int steps, bool empty_cache_between_steps) {
  std::mt19937 rng(7);
  std::vector<void*> parameters;
  for (int i = 0; i < 8; ++i) parameters.push_back(a.allocate(3 * kMiB + 4096 * static_cast<std::size_t>(i), 0));
  const std::size_t lengths[] = {512, 896, 1536, 2048, 640, 3072, 1024};
  for (int step = 0; step < steps; ++step) {
    const std::size_t tokens = lengths[(static_cast<std::size_t>(step) * 3 + rng() % 2) % std::size(lengths)];
    std::vector<void*> saved;
    for (int layer = 0; layer < 6; ++layer) {
      const auto region = alloc::TagScope::region("layers." + std::to_string(layer));
      for (const std::size_t scale : {2u, 6u, 8u, 2u}) saved.push_back(a.allocate(tokens * 1024 * scale + 1000, 0));
      void* temporary = a.allocate(tokens * 300 + rng() % 5000, 0);
      void* small = a.allocate(4096 + rng() % 60000, 0);
      a.deallocate(temporary);
      a.deallocate(small);
    }
    while (!saved.empty()) {
      void* gradient = a.allocate(tokens * 2048 + 512, 0);
      a.deallocate(saved.back());
      saved.pop_back();
      a.deallocate(gradient);
    }
    if (empty_cache_between_steps && step % 3 == 2) a.empty_cache();
  }
  for (void* p : parameters) a.deallocate(p);
}

struct Case {
  const char* name;
  const char* conf;
  bool empty_cache;
};

class ReplayUnderRecordedSettings : public ::testing::TestWithParam<Case> {};

TEST_P(ReplayUnderRecordedSettings, GivesTheRecordedPeaksExactly) {
  const Case c = GetParam();
  const alloc::Config config = config_of(c.conf);
  const Recording recording = record(config, [&](alloc::CachingAllocator& a) { training(a, 20, c.empty_cache); },
                                     c.name);
  const Replayed replayed = replay(recording.trace_path, {config});
  ASSERT_EQ(replayed.runs.size(), 1u);
  const WhatIfRun& run = replayed.runs[0];
  std::printf("%s (%s): recorded peak reserved %lld, allocated %lld; replayed %llu, %llu\n", c.name, c.conf,
              static_cast<long long>(recording.stats.reserved_bytes.peak),
              static_cast<long long>(recording.stats.allocated_bytes.peak),
              static_cast<unsigned long long>(run.peak_reserved), static_cast<unsigned long long>(run.peak_allocated));
  EXPECT_EQ(run.peak_reserved, static_cast<std::uint64_t>(recording.stats.reserved_bytes.peak));
  EXPECT_EQ(run.peak_allocated, static_cast<std::uint64_t>(recording.stats.allocated_bytes.peak));
  EXPECT_EQ(run.final_reserved, static_cast<std::uint64_t>(recording.stats.reserved_bytes.current));
  EXPECT_FALSE(run.failure.has_value());
  EXPECT_EQ(replayed.counts.skipped_frees, 0u);
  EXPECT_EQ(replayed.counts.allocs, recording.stats.allocations.total_added);
  EXPECT_EQ(replayed.counts.frees, replayed.counts.allocs);
  if (c.empty_cache) {
    EXPECT_GT(replayed.counts.empty_cache_calls, 0u);
  }
  std::remove(recording.trace_path.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Workloads, ReplayUnderRecordedSettings,
    ::testing::Values(Case{"defaults", "", false}, Case{"expandable", "expandable_segments:True", false},
                      Case{"max_split", "max_split_size_mb:24", false},
                      Case{"roundup", "roundup_power2_divisions:4", false},
                      Case{"empty_cache", "", true},
                      Case{"expandable_empty_cache", "expandable_segments:True", true}),
    [](const ::testing::TestParamInfo<Case>& param) { return std::string(param.param.name); });

TEST(WhatIfReplay, ExpandableSegmentsReserveLessWhenSequenceLengthsChange) {
  const Recording recording =
      record(alloc::Config{}, [](alloc::CachingAllocator& a) { training(a, 30, false); }, "varying");
  const Replayed replayed = replay(recording.trace_path, {alloc::Config{}, config_of("expandable_segments:True")});
  ASSERT_EQ(replayed.runs.size(), 2u);
  const WhatIfRun& fixed = replayed.runs[0];
  const WhatIfRun& expandable = replayed.runs[1];
  std::printf("peak reserved: default %llu bytes (%.1f MiB), expandable_segments:True %llu bytes (%.1f MiB)\n",
              static_cast<unsigned long long>(fixed.peak_reserved), static_cast<double>(fixed.peak_reserved) / kMiB,
              static_cast<unsigned long long>(expandable.peak_reserved),
              static_cast<double>(expandable.peak_reserved) / kMiB);
  EXPECT_EQ(fixed.peak_reserved, static_cast<std::uint64_t>(recording.stats.reserved_bytes.peak));
  EXPECT_LT(expandable.peak_reserved, fixed.peak_reserved);
  EXPECT_LT(expandable.fragmentation_at_peak, fixed.fragmentation_at_peak);
  EXPECT_EQ(fixed.conf, "max_split_size_mb:unlimited,memory_fraction:1");
  EXPECT_EQ(expandable.conf, "max_split_size_mb:unlimited,memory_fraction:1,expandable_segments:True");
  std::remove(recording.trace_path.c_str());
}

TEST(WhatIfReplay, StopsAtTheFirstAllocationThatDoesNotFitAndNamesItsHolders) {
  const Recording recording = record(
      alloc::Config{},
      [](alloc::CachingAllocator& a) {
        const auto region = alloc::TagScope::region("big");
        void* first = a.allocate(30 * kMiB, 0);
        {
          const auto inner = alloc::TagScope::region("small");
          void* second = a.allocate(8 * kMiB, 7);
          a.deallocate(second);
        }
        void* third = a.allocate(40 * kMiB, 0);  // does not fit 64 MiB beside the first
        a.deallocate(third);
        a.deallocate(first);
      },
      "capacity");
  const Replayed replayed = replay(recording.trace_path, {alloc::Config{}, config_of("expandable_segments:True")},
                                   64 * kMiB);
  for (const WhatIfRun& run : replayed.runs) {
    ASSERT_TRUE(run.failure.has_value()) << run.conf;
    EXPECT_EQ(run.failure->size, 40 * kMiB);
    EXPECT_EQ(run.failure->stream, 0u);
    EXPECT_EQ(run.failure->allocated_bytes, 30 * kMiB);
    ASSERT_EQ(run.failure->holders.size(), 1u);
    EXPECT_EQ(run.failure->holders[0].region, "big");
    EXPECT_EQ(run.failure->holders[0].bytes, 30 * kMiB);
    EXPECT_EQ(run.events_replayed, run.failure->event);
    EXPECT_LE(run.peak_reserved, 64 * kMiB);
  }
  // Fixed segments: the 30 MiB and the cached 20 MiB segment of the 8 MiB block; expandable: one.
  EXPECT_EQ(replayed.runs[0].failure->reserved_bytes, 50 * kMiB);
  std::remove(recording.trace_path.c_str());
}

TEST(WhatIfReplay, SkipsFreesOfAddressesAllocatedBeforeTheTraceBegan) {
  const auto path = (std::filesystem::temp_directory_path() / "remat-whatif-skipped.jsonl").string();
  std::ofstream(path)
      << R"({"kind":"trace","schema_version":1,"producer":"test","created_at":"2026-01-01T00:00:00Z","host":"h","pid":1,"rank":0,"device":0,"names":[""],"tags":[{"region":0,"policy":"none","phase":"other","site":0,"recv":null}],"event_count":4})"
         "\n"
      << R"({"action":"free_completed","time_us":1,"address":4096,"size":1048576,"stream":0,"tag":0})" "\n"
      << R"({"action":"alloc","time_us":2,"address":8192,"size":2097152,"stream":0,"tag":0})" "\n"
      << R"({"action":"segment_free","time_us":3,"address":65536,"size":2097152,"stream":0,"tag":0})" "\n"
      << R"({"action":"free_completed","time_us":4,"address":8192,"size":2097152,"stream":0,"tag":0})" "\n";
  const Replayed replayed = replay(path, {alloc::Config{}});
  EXPECT_EQ(replayed.counts.events, 4u);
  EXPECT_EQ(replayed.counts.skipped_frees, 1u);
  EXPECT_EQ(replayed.counts.allocs, 1u);
  EXPECT_EQ(replayed.counts.frees, 1u);
  EXPECT_EQ(replayed.counts.empty_cache_calls, 1u);
  EXPECT_EQ(replayed.runs[0].peak_allocated, 2 * kMiB);
  EXPECT_EQ(replayed.runs[0].peak_reserved, 20 * kMiB);  // 1 MiB to 10 MiB requests share 20 MiB segments
  EXPECT_EQ(replayed.runs[0].device_allocations, 1u);
  EXPECT_EQ(replayed.runs[0].final_reserved, 20 * kMiB);  // empty_cache came while the block was live
  std::remove(path.c_str());
}

}  // namespace
}  // namespace remat::report
