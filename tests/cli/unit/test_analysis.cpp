// Replaying events into live and peak bytes, timelines and the hot-path line decoder.
#include "analysis/live_replay.hpp"
#include "analysis/segment_map.hpp"
#include "analysis/timeline_series.hpp"
#include "reader/event_line.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace remat::report {
namespace {

TagTable two_regions() {
  TagTable tags;
  tags.names = {"", "layers.0::attention", "layers.1::mlp"};
  tags.tags = {Tag{}, Tag{1, Policy::save, Phase::forward, 0, std::nullopt},
               Tag{2, Policy::recompute, Phase::recompute, 0, RecvSlot{1, 'B', 3}}};
  return tags;
}

Event ev(Action action, std::int64_t time, std::uint64_t address, std::uint64_t size, std::uint32_t tag) {
  return Event{action, time, address, size, 0, tag};
}

// The replay of `events`, in order, over the tags of two_regions(), grouped `by`.
LiveReplay replay_of(GroupBy by, std::initializer_list<Event> events) {
  static const TagTable tags = two_regions();
  LiveReplay replay(tags, by);
  for (const Event& event : events) replay.apply(event);
  return replay;
}

TEST(LiveReplay, FreeRequestedEndsAnAllocationAndPeaksAreKeptPerGroup) {
  const LiveReplay replay =
      replay_of(GroupBy::region, {ev(Action::alloc, 0, 0x1000, 100, 1), ev(Action::alloc, 1, 0x2000, 50, 2),
                                  ev(Action::free_requested, 2, 0x1000, 100, 1),
                                  ev(Action::free_completed, 3, 0x1000, 100, 1),  // already released: no double count
                                  ev(Action::alloc, 4, 0x3000, 30, 1)});
  const auto& labels = replay.labels();
  const auto index = [&](const std::string& name) {
    return static_cast<std::size_t>(std::find(labels.begin(), labels.end(), GroupLabel::name(name)) - labels.begin());
  };
  EXPECT_EQ(replay.live()[index("layers.0::attention")], 30u);
  EXPECT_EQ(replay.peak()[index("layers.0::attention")], 100u);
  EXPECT_EQ(replay.live()[index("layers.1::mlp")], 50u);
  EXPECT_EQ(replay.total(), 80u);
  EXPECT_EQ(replay.peak_total(), 150u);
  EXPECT_EQ(replay.peak_time(), 1);
  EXPECT_EQ(replay.unmatched_frees(), 0u);
}

TEST(LiveReplay, FreeCompletedAloneAlsoEndsAnAllocation) {
  const LiveReplay replay =
      replay_of(GroupBy::phase, {ev(Action::alloc, 0, 0x1000, 100, 1), ev(Action::free_completed, 1, 0x1000, 100, 1)});
  EXPECT_EQ(replay.total(), 0u);
}

TEST(LiveReplay, FreesOfBlocksAllocatedBeforeTheTraceAreCountedNotSubtracted) {
  const LiveReplay replay = replay_of(
      GroupBy::region, {ev(Action::alloc, 0, 0x1000, 100, 1), ev(Action::free_requested, 1, 0x9000, 4096, 1)});
  EXPECT_EQ(replay.total(), 100u);
  EXPECT_EQ(replay.unmatched_frees(), 1u);
}

TEST(LiveReplay, ARetagMovesALiveBlockToItsNewCategoryForLaterPeaks) {
  TagTable tags;
  tags.names = {"", "layers.0", "w"};
  tags.tags = {Tag{}, Tag{}, Tag{}};
  tags.tags[1].category = 5;  // temporary of layers.0
  tags.tags[1].module = 1;
  tags.tags[2].category = 1;  // parameter w
  tags.tags[2].module = 2;
  LiveReplay replay(tags, GroupBy::category);
  replay.apply(ev(Action::alloc, 0, 0x1000, 100, 1));
  replay.apply(ev(Action::retag, 1, 0x1000, 100, 2));
  replay.apply(ev(Action::retag, 2, 0x7000, 64, 2));  // allocated before the trace: nothing to move
  replay.apply(ev(Action::alloc, 3, 0x2000, 50, 1));  // the peak: 150 bytes, 100 of them the parameter
  const auto& labels = replay.labels();
  const auto index = [&](const std::string& name) {
    return static_cast<std::size_t>(std::find(labels.begin(), labels.end(), GroupLabel::name(name)) - labels.begin());
  };
  ASSERT_LT(index("parameter"), labels.size());
  ASSERT_LT(index("temporary"), labels.size());
  EXPECT_EQ(replay.live()[index("parameter")], 100u);
  EXPECT_EQ(replay.live_count()[index("parameter")], 1u);
  EXPECT_EQ(replay.live()[index("temporary")], 50u);
  EXPECT_EQ(replay.live_at_peak()[index("parameter")], 100u);
  EXPECT_EQ(replay.live_at_peak()[index("temporary")], 50u);
  EXPECT_EQ(replay.peak()[index("temporary")], 100u);  // before the retag, the block was a temporary
  EXPECT_EQ(replay.peak_total(), 150u);
  EXPECT_EQ(replay.action_count(Action::retag), 2u);
  replay.apply(ev(Action::free_requested, 4, 0x1000, 100, 2));
  EXPECT_EQ(replay.live()[index("parameter")], 0u);
  EXPECT_EQ(replay.total(), 50u);
}

TEST(LiveReplay, GroupsBySlotNameTheRecvSlot) {
  const TagTable tags = two_regions();
  LiveReplay replay(tags, GroupBy::slot);
  replay.apply(ev(Action::alloc, 0, 0x1000, 64, 2));
  const auto& labels = replay.labels();
  EXPECT_NE(std::find(labels.begin(), labels.end(), GroupLabel::name("stage 1 B slot 3")), labels.end());
}

TEST(SegmentRebuilder, CountsLiveBlocksOutsideEverySegmentInsteadOfDroppingThem) {
  SegmentRebuilder rebuilder;
  rebuilder.on_event(ev(Action::segment_alloc, 0, 1 << 20, 1 << 20, 0));
  rebuilder.on_event(ev(Action::alloc, 1, 1 << 20, 8192, 1));           // inside the segment
  rebuilder.on_event(ev(Action::alloc, 2, 1 << 30, 8192, 1));           // its segment_alloc fell off the ring
  rebuilder.on_event(ev(Action::alloc, 3, (2 << 20) - 4096, 8192, 2));  // runs past the segment's end
  rebuilder.on_event(ev(Action::alloc, 4, 3 << 30, 512, 2));            // freed: not counted
  rebuilder.on_event(ev(Action::free_completed, 5, 3 << 30, 512, 2));
  const RebuiltSegments rebuilt = rebuilder.rebuild();
  ASSERT_EQ(rebuilt.segments.size(), 1u);
  EXPECT_EQ(rebuilt.segments[0].allocated_size, 8192u);
  EXPECT_EQ(rebuilt.blocks_outside, 2u);
  EXPECT_EQ(rebuilt.bytes_outside, 16384u);
}

TEST(SegmentRebuilder, AReleaseInTheMiddleOfAMappedRunLeavesBothSides) {
  // Expandable segments unmap free pages between live blocks: 60 MiB mapped, 20 MiB given back
  // from 10 MiB on; requested sizes come from the events that record them.
  constexpr std::uint64_t kM = 1 << 20;
  SegmentRebuilder rebuilder;
  rebuilder.on_event(ev(Action::segment_alloc, 0, 64 * kM, 60 * kM, 0));
  Event first = ev(Action::alloc, 1, 64 * kM, 10 * kM, 0);
  first.requested = 10 * kM - 100;
  rebuilder.on_event(first);
  rebuilder.on_event(ev(Action::alloc, 2, 94 * kM, 30 * kM, 0));
  rebuilder.on_event(ev(Action::segment_free, 3, 74 * kM, 20 * kM, 0));
  const RebuiltSegments rebuilt = rebuilder.rebuild();
  ASSERT_EQ(rebuilt.segments.size(), 2u);
  EXPECT_EQ(rebuilt.segments[0].address, 64 * kM);
  EXPECT_EQ(rebuilt.segments[0].total_size, 10 * kM);
  ASSERT_EQ(rebuilt.segments[0].blocks.size(), 1u);
  EXPECT_EQ(rebuilt.segments[0].blocks[0].requested_size, 10 * kM - 100);
  EXPECT_EQ(rebuilt.segments[1].address, 94 * kM);
  EXPECT_EQ(rebuilt.segments[1].total_size, 30 * kM);
  EXPECT_EQ(rebuilt.blocks_outside, 0u);
}

TEST(Timeline, StackedSeriesAddUpToTheTotalInEveryBucketAndKeepThePeak) {
  const TagTable tags = two_regions();
  TimelineBuilder builder(tags, GroupBy::region, 64);
  std::mt19937_64 rng(7);
  std::vector<std::pair<std::uint64_t, std::uint32_t>> live;
  std::uint64_t next = 0x1000;
  LiveReplay reference(tags, GroupBy::region);
  for (std::int64_t t = 0; t < 100000; t += 3) {
    Event e;
    if (live.empty() || rng() % 3 != 0) {
      e = ev(Action::alloc, t, next, 1 + rng() % 5000, static_cast<std::uint32_t>(rng() % 3));
      live.emplace_back(next, e.tag);
      next += 8192;
    } else {
      const std::size_t i = rng() % live.size();
      e = ev(Action::free_requested, t, live[i].first, 0, live[i].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    builder.on_event(e);
    reference.apply(e);
  }
  const Timeline timeline = builder.finish(12);
  ASSERT_GT(timeline.totals.size(), 32u);  // coarsened, but most buckets used
  ASSERT_LE(timeline.totals.size(), 64u);
  for (std::size_t b = 0; b < timeline.totals.size(); ++b) {
    std::uint64_t sum = 0;
    for (const TimelineSeries& s : timeline.series) sum += s.values[b];
    EXPECT_EQ(sum, timeline.totals[b]) << "bucket " << b;
  }
  EXPECT_EQ(*std::max_element(timeline.totals.begin(), timeline.totals.end()), reference.peak_total());
  EXPECT_EQ(timeline.peak_bytes, reference.peak_total());
}

TEST(Timeline, GroupsBeyondTheSeriesLimitAreFoldedIntoOther) {
  const TagTable tags = two_regions();
  TimelineBuilder builder(tags, GroupBy::region, 16);
  builder.on_event(ev(Action::alloc, 0, 0x1000, 10, 0));
  builder.on_event(ev(Action::alloc, 1, 0x2000, 20, 1));
  builder.on_event(ev(Action::alloc, 2, 0x3000, 30, 2));
  const Timeline timeline = builder.finish(2);
  ASSERT_EQ(timeline.series.size(), 2u);
  EXPECT_EQ(timeline.series[0].label, GroupLabel::name("layers.1::mlp"));
  EXPECT_EQ(timeline.series[1].label, GroupLabel::own("other (2 groups)"));
  EXPECT_TRUE(timeline.series[1].other);
  EXPECT_EQ(timeline.series[1].values.back(), 30u);
}

TEST(EventLine, DecodesTheUsualShapeInAnyKeyOrder) {
  RawEvent e;
  ASSERT_TRUE(decode_event_line(
      R"( {"tag": 3, "size":1048576,"action":"free_requested","stream":7,"address":140000000000,"time_us":-12} )", e));
  EXPECT_EQ(e.action, "free_requested");
  EXPECT_EQ(e.time_us, -12);
  EXPECT_EQ(e.address, 140000000000u);
  EXPECT_EQ(e.size, 1048576u);
  EXPECT_EQ(e.stream, 7u);
  EXPECT_EQ(e.tag, 3u);
  EXPECT_EQ(e.requested, 0u);
  // An alloc's requested size, when recorded; the next line without one reads 0 again.
  ASSERT_TRUE(decode_event_line(
      R"({"action":"alloc","time_us":1,"address":4096,"size":1536,"stream":0,"tag":0,"requested":1000})", e));
  EXPECT_EQ(e.size, 1536u);
  EXPECT_EQ(e.requested, 1000u);
  ASSERT_TRUE(decode_event_line(R"({"action":"alloc","time_us":2,"address":8192,"size":512,"stream":0,"tag":0})", e));
  EXPECT_EQ(e.requested, 0u);
}

TEST(EventLine, LeavesEverythingUnusualToTheFullParser) {
  RawEvent e;
  const char* unusual[] = {
      R"({"action":"alloc","time_us":1,"address":2,"size":3,"stream":0})",                  // missing tag
      R"({"action":"alloc","time_us":1,"address":2,"size":3,"stream":0,"requested":3})",    // requested, no tag
      R"({"action":"al\u006coc","time_us":1,"address":2,"size":3,"stream":0,"tag":0})",     // escape
      R"({"action":"alloc","time_us":1.5,"address":2,"size":3,"stream":0,"tag":0})",        // fraction
      R"({"action":"alloc","time_us":1,"address":2,"size":-3,"stream":0,"tag":0})",         // negative size
      R"({"action":"alloc","time_us":1,"address":2,"size":012,"stream":0,"tag":0})",        // leading zero
      R"({"action":"alloc","time_us":1,"address":2,"size":3,"stream":0,"tag":0,"tag":1})",  // duplicate
      R"({"action":"alloc","time_us":1,"address":2,"size":99999999999999999999,"stream":0,"tag":0})",
      R"({"action":"alloc","time_us":1,"address":2,"size":3,"stream":0,"tag":0} x)",            // trailing
      R"({"action":"alloc","time_us":1,"address":2,"size":3,"stream":0,"tag":0,"x":[1]})",      // nested
      R"({"action":"alloc","time_us":1,"address":2,"size":3,"stream":0,"tag":0,"x":1,"x":2})",  // another key, twice
      R"({"note":"a","action":"alloc","time_us":1,"address":2,"size":3,"stream":0,"tag":0})",   // another key
      R"({"action":"alloc","time_us":1,"address":2,"size":3,"stream":0,"tag":0)",               // cut
  };
  for (const char* line : unusual) EXPECT_FALSE(decode_event_line(line, e)) << line;
}

}  // namespace
}  // namespace remat::report
