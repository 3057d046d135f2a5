#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>
#include <remat/alloc/trace.hpp>

#include <gtest/gtest.h>

#include <thread>

using namespace remat::alloc;
using namespace remat::alloc::testing;

namespace {

std::vector<TraceAction> actions(const std::vector<TraceEvent>& events) {
  std::vector<TraceAction> out;
  for (const TraceEvent& e : events) out.push_back(e.action);
  return out;
}

}  // namespace

TEST(TraceRing, KeepsTheNewestEventsAndCountsDropped) {
  TraceRing ring(3);
  for (std::uint64_t i = 1; i <= 5; ++i) ring.record(TraceAction::alloc, i * 512, 512, 0, 0);
  const auto events = ring.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].address, 3u * 512);
  EXPECT_EQ(events[2].address, 5u * 512);
  EXPECT_EQ(ring.dropped(), 2u);
  EXPECT_EQ(ring.events(2).front().address, 4u * 512);
}

// A free completed at once is one record read back as both events, with one time.
TEST(TraceRing, AnImmediateFreeReadsBackAsRequestAndCompletion) {
  TraceRing ring(8);
  ring.record(TraceAction::alloc, 4096, 512, 7, 3);
  ring.record_immediate_free(4096, 512, 7, 3);
  const auto events = ring.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(actions(events), (std::vector<TraceAction>{TraceAction::alloc, TraceAction::free_requested,
                                                       TraceAction::free_completed}));
  for (const TraceEvent& e : events) {
    EXPECT_EQ(e.address, 4096u);
    EXPECT_EQ(e.size, 512u);
    EXPECT_EQ(e.stream, 7u);
    EXPECT_EQ(e.tag, 3u);
  }
  EXPECT_EQ(events[1].time_us, events[2].time_us);
  EXPECT_EQ(ring.recorded(), 2u);
}

TEST(TraceRing, ALimitCanCutAnImmediateFreeToItsCompletion) {
  TraceRing ring(8);
  ring.record_immediate_free(512, 512, 0, 0);
  ring.record(TraceAction::alloc, 1024, 512, 0, 0);
  EXPECT_EQ(actions(ring.events(2)), (std::vector<TraceAction>{TraceAction::free_completed, TraceAction::alloc}));
  EXPECT_EQ(ring.events(3).size(), 3u);
  EXPECT_EQ(ring.events(1).front().address, 1024u);
  EXPECT_TRUE(ring.events(0).empty());
}

TEST(TraceRing, CapacityZeroSwitchesTracingOff) {
  TraceRing ring(0);
  ring.record(TraceAction::alloc, 512, 512, 0, 0);
  EXPECT_FALSE(ring.enabled());
  EXPECT_TRUE(ring.events().empty());
}

// Threads on different cores record into one ring: the trace still reads back in time
// order, which remat-report requires of every trace.
TEST(Trace, TimesStayInOrderWhenThreadsContendForTheLock) {
  HostAllocator a("trace_entries:65536");
  constexpr int kThreads = 4;
  constexpr int kPairs = 4000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&a] {
      for (int i = 0; i < kPairs; ++i) a.free(a.alloc(4096));
    });
  }
  for (std::thread& thread : threads) thread.join();
  const auto events = a.allocator->snapshot().trace;
  ASSERT_GE(events.size(), static_cast<std::size_t>(kThreads * kPairs * 3));
  for (std::size_t i = 1; i < events.size(); ++i) {
    ASSERT_LE(events[i - 1].time_us, events[i].time_us) << "event " << i << " goes back in time";
  }
}

TEST(Trace, RecordsTheLifecycleOfABlockInOrder) {
  HostAllocator a("trace_entries:64");
  a.host->hold_stream(7);
  void* p = a.alloc(1000, 1);
  a.allocator->record_stream(p, 7);
  a.free(p);
  a.host->complete_stream(7);
  a.allocator->empty_cache();
  const auto events = a.allocator->snapshot().trace;
  EXPECT_EQ(actions(events), (std::vector<TraceAction>{TraceAction::segment_alloc, TraceAction::alloc,
                                                       TraceAction::free_requested, TraceAction::free_completed,
                                                       TraceAction::segment_free}));
  EXPECT_EQ(events[1].address, addr(p));
  EXPECT_EQ(events[1].size, 1024u);
  EXPECT_EQ(events[1].requested, 1000u);  // the size asked for, beside the block's
  EXPECT_EQ(events[2].requested, 0u);
  EXPECT_EQ(events[1].stream, 1u);
  EXPECT_EQ(events[0].size, 2 * MiB);
  EXPECT_LE(events.front().time_us, events.back().time_us);
}

TEST(Trace, RecordsOomWithTheRequestedSize) {
  HostAllocator a("trace_entries:16", 4);
  EXPECT_THROW(a.alloc(5 * MiB), OutOfMemoryError);
  const auto events = a.allocator->snapshot().trace;
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().action, TraceAction::oom);
  EXPECT_EQ(events.back().size, 5 * MiB);
  EXPECT_EQ(events.back().requested, 5 * MiB);
}

TEST(Trace, CanBeResizedAndSwitchedOffOnALiveAllocator) {
  HostAllocator a("trace_entries:8");
  a.free(a.alloc(512));
  Config config = Config::parse("trace_entries:0", Config{});
  a.allocator->apply_config(config);
  a.free(a.alloc(512));
  const AllocatorSnapshot snap = a.allocator->snapshot();
  EXPECT_TRUE(snap.trace.empty());
  EXPECT_EQ(snap.trace_capacity, 0u);
}
