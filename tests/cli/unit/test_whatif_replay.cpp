// The what-if replay against the allocator it imitates: workloads recorded with the caching pool
// on the host backend, written as JSON Lines traces, replayed under the recorded settings, give
// the recorded peaks exactly; other settings give the figures they should.

#include "analysis/whatif_replay.hpp"
#include "cli_runner.hpp"
#include "reader/dump_file.hpp"
#include "reader/trace_file.hpp"

#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/config.hpp>
#include <remat/alloc/host_backend.hpp>
#include <remat/alloc/snapshot.hpp>
#include <remat/alloc/tags.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
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
  std::uint64_t device_allocations = 0;  // segments allocated and ranges mapped
  std::string trace_path;
};

alloc::Config config_of(const std::string& text) {
  return alloc::Config::parse(text, alloc::Config{}, "test");
}

// Runs `workload` on a fresh pool over host memory with a trace ring large enough to keep every
// event, and writes its trace.
Recording record(const alloc::Config& config, const Workload& workload, const std::string& name) {
  alloc::Config recorded = config;
  recorded.trace_entries = std::size_t{1} << 17;
  alloc::CachingAllocator allocator(std::make_unique<alloc::HostBackend>(kHostCapacity), recorded);
  workload(allocator);
  Recording out;
  out.stats = allocator.stats();
  for (const alloc::TraceEvent& event : allocator.snapshot().trace) {
    if (event.action == alloc::TraceAction::segment_alloc) ++out.device_allocations;
  }
  out.trace_path = (std::filesystem::temp_directory_path() / ("remat-whatif-" + name + ".jsonl")).string();
  std::ofstream(out.trace_path) << alloc::trace_to_jsonl(allocator.snapshot());
  return out;
}

struct Replayed {
  std::vector<WhatIfRun> runs;
  WhatIfCounts counts;
};

// Replays on a device the size of the recording's, the first run following the recording.
Replayed replay(const std::string& path, const std::vector<alloc::Config>& configs,
                std::uint64_t capacity = kHostCapacity) {
  const DumpFile dump = open_dump(path);
  TraceFile trace(dump);
  WhatIfReplay replay(configs, capacity, 0, trace.header().tags, /*follow_recording=*/true);
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
  EXPECT_TRUE(run.followed_recording);
  EXPECT_FALSE(run.drift.has_value());
  EXPECT_EQ(replayed.counts.skipped_frees, 0u);
  EXPECT_EQ(replayed.counts.allocs, recording.stats.allocations.total_added);
  EXPECT_EQ(replayed.counts.frees, replayed.counts.allocs);
  if (c.empty_cache) {
    EXPECT_GT(replayed.counts.empty_cache_calls, 0u);
  }
  std::remove(recording.trace_path.c_str());
}

// `whatif` on a trace: the header's settings make the first run "recorded" and give the
// recording's peaks; a trace without them (written before they were recorded) is replayed under
// the defaults, and its first run is named for what it is.
TEST(WhatIfCommand, ATraceReplaysUnderTheSettingsItsHeaderRecords) {
  const Recording recording = record(config_of("expandable_segments:True"),
                                     [](alloc::CachingAllocator& a) { training(a, 12, false); }, "header-settings");
  const testing::CliResult with = testing::run({"whatif", recording.trace_path, "--json"});
  ASSERT_EQ(with.code, 0) << with.err;
  const auto dump = nlohmann::json::parse(with.out);
  EXPECT_EQ(dump["recorded_config_from"], "the trace header's config.text");
  const auto& recorded = dump["runs"][0];
  EXPECT_EQ(recorded["name"], "recorded");
  EXPECT_NE(recorded["conf"].get<std::string>().find("expandable_segments:True"), std::string::npos)
      << recorded["conf"];
  EXPECT_EQ(recorded["peak_reserved"], recording.stats.reserved_bytes.peak);
  EXPECT_EQ(recorded["peak_allocated"], recording.stats.allocated_bytes.peak);

  // The same trace as one written before the header recorded settings.
  std::ifstream in(recording.trace_path);
  std::string header_line;
  std::getline(in, header_line);
  auto header = nlohmann::json::parse(header_line);
  header.erase("config");
  const std::string old_path = recording.trace_path + ".no-settings.jsonl";
  {
    std::ofstream out(old_path);
    out << header.dump() << "\n" << in.rdbuf();
  }
  const testing::CliResult without = testing::run({"whatif", old_path, "--json"});
  ASSERT_EQ(without.code, 0) << without.err;
  const auto defaults = nlohmann::json::parse(without.out);
  EXPECT_EQ(defaults["recorded_config_from"], "defaults (none recorded)");
  EXPECT_EQ(defaults["runs"][0]["name"], "defaults");
  EXPECT_EQ(defaults["runs"][0]["conf"].get<std::string>().find("expandable_segments:True"), std::string::npos);
  const testing::CliResult text = testing::run({"whatif", old_path});
  EXPECT_NE(text.out.find("this trace's header records no allocator settings"), std::string::npos) << text.out;
  const std::size_t columns = text.out.find("\nfigure ");
  ASSERT_NE(columns, std::string::npos) << text.out;
  const std::string titles = text.out.substr(columns + 1, text.out.find('\n', columns + 1) - columns - 1);
  EXPECT_EQ(titles.find("recorded"), std::string::npos) << titles;
  EXPECT_NE(titles.find("defaults"), std::string::npos) << titles;
  std::remove(recording.trace_path.c_str());
  std::remove(old_path.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Workloads, ReplayUnderRecordedSettings,
    ::testing::Values(Case{"defaults", "", false}, Case{"expandable", "expandable_segments:True", false},
                      Case{"max_split", "max_split_size_mb:24", false},
                      Case{"roundup", "roundup_power2_divisions:4", false},
                      Case{"empty_cache", "", true},
                      Case{"expandable_empty_cache", "expandable_segments:True", true}),
    [](const ::testing::TestParamInfo<Case>& param) { return std::string(param.param.name); });

// Random workloads: sizes from 1 B to 70 MB (half uniform, half log-uniform), up to 60 blocks live, on one or
// several streams, some blocks used on another stream (record_stream), some empty_cache calls.
struct RandomCase {
  const char* name;
  const char* conf;
  int streams;
  bool record_stream;
  bool empty_cache;
};

void random_workload(alloc::CachingAllocator& a, std::uint32_t seed, const RandomCase& c) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(0.0, std::log(70e6));
  std::uniform_int_distribution<std::size_t> uniform_size(1, 70'000'000);
  std::vector<void*> live;
  for (int step = 0; step < 1500; ++step) {
    if (live.size() < 60 && (live.empty() || rng() % 2 == 0)) {
      const std::size_t size =
          rng() % 2 == 0 ? uniform_size(rng) : static_cast<std::size_t>(std::exp(log_size(rng)));
      const auto stream = static_cast<alloc::Stream>(rng() % static_cast<std::uint64_t>(c.streams));
      void* p = a.allocate(std::max<std::size_t>(size, 1), stream);
      if (c.record_stream && rng() % 4 == 0) a.record_stream(p, stream + 1);
      live.push_back(p);
    } else {
      const std::size_t victim = rng() % live.size();
      a.deallocate(live[victim]);
      live[victim] = live.back();
      live.pop_back();
    }
    if (c.empty_cache && rng() % 150 == 0) a.empty_cache();
  }
  for (void* p : live) a.deallocate(p);
}

class RandomWorkloadsUnderRecordedSettings : public ::testing::TestWithParam<RandomCase> {};

TEST_P(RandomWorkloadsUnderRecordedSettings, ReplayEveryOneExactly) {
  const RandomCase c = GetParam();
  const alloc::Config config = config_of(c.conf);
  constexpr std::uint32_t kSeeds = 32;
  std::uint32_t exact = 0;
  for (std::uint32_t seed = 0; seed < kSeeds; ++seed) {
    const Recording recording = record(
        config, [&](alloc::CachingAllocator& a) { random_workload(a, seed, c); },
        std::string(c.name) + "-" + std::to_string(seed));
    const Replayed replayed = replay(recording.trace_path, {config});
    const WhatIfRun& run = replayed.runs.at(0);
    const bool same = 
                      run.peak_reserved == static_cast<std::uint64_t>(recording.stats.reserved_bytes.peak) &&
                      run.peak_allocated == static_cast<std::uint64_t>(recording.stats.allocated_bytes.peak) &&
                      run.final_reserved == static_cast<std::uint64_t>(recording.stats.reserved_bytes.current) &&
                      run.device_allocations == recording.device_allocations &&
                      !run.failure.has_value();
    if (same) ++exact;
    EXPECT_TRUE(same) << c.name << " seed " << seed << ": recorded peak reserved "
                      << recording.stats.reserved_bytes.peak << ", allocated " << recording.stats.allocated_bytes.peak
                      << ", device allocations " << recording.device_allocations << "; replayed "
                      << run.peak_reserved << ", " << run.peak_allocated << ", " << run.device_allocations
                      << (run.drift ? "; left the recording at event " + std::to_string(run.drift->event) + ": " +
                                          run.drift->reason
                                    : std::string());
    std::remove(recording.trace_path.c_str());
  }
  std::printf("%s (%s): %u of %u random workloads replay exactly\n", c.name, c.conf, exact, kSeeds);
}

INSTANTIATE_TEST_SUITE_P(
    Random, RandomWorkloadsUnderRecordedSettings,
    ::testing::Values(RandomCase{"single_stream", "", 1, false, false},
                      RandomCase{"multi_stream", "", 3, false, false},
                      RandomCase{"record_stream", "", 2, true, false},
                      RandomCase{"empty_cache", "", 2, true, true},
                      RandomCase{"expandable", "expandable_segments:True", 1, false, false},
                      RandomCase{"expandable_streams", "expandable_segments:True", 3, true, true},
                      RandomCase{"max_split", "max_split_size_mb:48", 2, true, false},
                      RandomCase{"roundup", "roundup_power2_divisions:4,garbage_collection_threshold:0.6,memory_fraction:0.5", 2, false, false}),
    [](const ::testing::TestParamInfo<RandomCase>& param) { return std::string(param.param.name); });

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

// Two equal free blocks in two segments: best fit takes the one at the lower address. The
// recorded device put its second segment below its first (as mmap does); followed, the replay
// does too and takes the same block, so the release that follows is the recorded one.
TEST(WhatIfReplay, FollowingTheRecordingBreaksTiesAsTheRecordedAllocatorDid) {
  constexpr std::uint64_t kHigh = 0x7f0004000000;
  constexpr std::uint64_t kLow = 0x7f0002000000;
  constexpr std::uint64_t kM = kMiB;
  std::string lines;
  std::uint64_t time = 0;
  auto event = [&](const char* action, std::uint64_t address, std::uint64_t size) {
    lines += "{\"action\":\"" + std::string(action) + "\",\"time_us\":" + std::to_string(++time) +
             ",\"address\":" + std::to_string(address) + ",\"size\":" + std::to_string(size) +
             ",\"stream\":0,\"tag\":0}\n";
  };
  auto freed = [&](std::uint64_t address, std::uint64_t size) {
    event("free_requested", address, size);
    event("free_completed", address, size);
  };
  // 20 MiB segments, shared by requests of 1 to 10 MiB.
  event("segment_alloc", kHigh, 20 * kM);
  event("alloc", kHigh, 6 * kM);
  event("alloc", kHigh + 6 * kM, 8 * kM);
  event("alloc", kHigh + 14 * kM, 6 * kM);
  event("segment_alloc", kLow, 20 * kM);
  event("alloc", kLow, 6 * kM);
  event("alloc", kLow + 6 * kM, 4 * kM);
  event("alloc", kLow + 10 * kM, 10 * kM);
  freed(kHigh, 6 * kM);
  freed(kHigh + 14 * kM, 6 * kM);
  freed(kLow, 6 * kM);
  event("alloc", kLow, 6 * kM);  // three free 6 MiB blocks tie: the lowest address
  freed(kHigh + 6 * kM, 8 * kM);
  event("segment_free", kHigh, 20 * kM);  // empty_cache: the first segment is whole and free
  const auto path = (std::filesystem::temp_directory_path() / "remat-whatif-tie.jsonl").string();
  std::ofstream(path) << R"({"kind":"trace","schema_version":1,"producer":"test","created_at":"2026-01-01T00:00:00Z","host":"h","pid":1,"rank":0,"device":0,"names":[""],"tags":[{"region":0,"policy":"none","phase":"other","site":0,"recv":null}],"event_count":null})"
                      << "\n"
                      << lines;
  auto final_reserved = [&](bool follow) {
    const DumpFile dump = open_dump(path);
    TraceFile trace(dump);
    WhatIfReplay replay({alloc::Config{}}, kHostCapacity, 0, trace.header().tags, follow);
    trace.stream(replay);
    const WhatIfRun run = replay.results().at(0);
    EXPECT_EQ(run.followed_recording, follow);
    EXPECT_FALSE(run.drift.has_value());
    return run.final_reserved;
  };
  EXPECT_EQ(final_reserved(true), 20 * kM);   // as recorded
  EXPECT_EQ(final_reserved(false), 40 * kM);  // its own segments ascend: the other block, nothing whole to free
  std::remove(path.c_str());
}

TEST(WhatIfReplay, SaysWhereItCouldNotFollowTheRecording) {
  // Recorded under expandable segments, replayed as if under the defaults: fixed segments soon
  // differ from the recorded mappings.
  const Recording recording = record(config_of("expandable_segments:True"),
                                     [](alloc::CachingAllocator& a) { training(a, 3, true); }, "drift");
  const Replayed replayed = replay(recording.trace_path, {alloc::Config{}});
  const WhatIfRun& run = replayed.runs.at(0);
  EXPECT_FALSE(run.followed_recording);
  ASSERT_TRUE(run.drift.has_value());
  EXPECT_GT(run.drift->event, 1u);
  EXPECT_LE(run.drift->event, replayed.counts.events);
  EXPECT_EQ(run.drift->reason, "the pool's new segment was not the one the recording made there");
  EXPECT_FALSE(run.failure.has_value());
  std::remove(recording.trace_path.c_str());
}

}  // namespace
}  // namespace remat::report
