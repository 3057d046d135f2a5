// The pool's books on their own: each call's effect on the statistics, the per-tag figures and
// the trace, without a pool or a backend.
#include "../../allocator/src/detail/ledger.hpp"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace remat::alloc::detail {
namespace {

Block live_block(std::uintptr_t address, std::size_t size, std::size_t requested, TagId tag, Stream stream = 0) {
  Block block;
  block.address = address;
  block.size = size;
  block.requested = requested;
  block.tag = tag;
  block.stream = stream;
  block.allocated = true;
  return block;
}

std::vector<TraceAction> actions(const Ledger& books) {
  std::vector<TraceAction> out;
  for (const TraceEvent& event : books.trace().events()) out.push_back(event.action);
  return out;
}

// The trace event for `block` (as live_block makes it) with `action` and `tag`.
void expect_block_event(const TraceEvent& event, TraceAction action, const Block& block, TagId tag) {
  EXPECT_EQ(event.action, action);
  EXPECT_EQ(event.address, block.address);
  EXPECT_EQ(event.size, block.size);
  EXPECT_EQ(event.requested, block.requested);
  EXPECT_EQ(event.tag, tag);
}

TEST(Ledger, AnAllocationCountsOnTheDeviceAndUnderItsTag) {
  Ledger books(16);
  const Block block = live_block(0x1000, 1024, 1000, 3);
  books.allocated(block);
  const AllocatorStats& stats = books.stats();
  EXPECT_EQ(stats.allocated_bytes.current, 1024);
  EXPECT_EQ(stats.active_bytes.current, 1024);
  EXPECT_EQ(stats.requested_bytes.current, 1000);
  EXPECT_EQ(stats.allocations.current, 1);
  ASSERT_EQ(books.tag_stats().size(), 4u);
  EXPECT_EQ(books.tag_stats()[3].bytes.current, 1024);
  EXPECT_EQ(books.tag_stats()[3].requested_bytes.current, 1000);
  EXPECT_EQ(books.tag_stats()[0].count.total_added, 0);
  const auto events = books.trace().events();
  ASSERT_EQ(events.size(), 1u);
  expect_block_event(events[0], TraceAction::alloc, block, 3);
}

TEST(Ledger, ARetagIsATraceEventCarryingTheBlocksNewTag) {
  Ledger books(16);
  Block block = live_block(0x1000, 1024, 1000, 3);
  books.allocated(block);
  books.retagged(block, 5);
  EXPECT_EQ(block.tag, 5u);
  EXPECT_EQ(books.tag_stats()[3].bytes.current, 0);
  EXPECT_EQ(books.tag_stats()[5].bytes.current, 1024);
  const auto events = books.trace().events();
  ASSERT_EQ(events.size(), 2u);
  expect_block_event(events[1], TraceAction::retag, block, 5);
  EXPECT_EQ(to_string(TraceAction::retag), "retag");
}

TEST(Ledger, AFreeOnAnotherStreamStaysActiveUntilItCompletes) {
  Ledger books(16);
  const Block block = live_block(0x2000, 4096, 4096, 1, 7);
  books.allocated(block);
  books.freed(block, /*now=*/false);
  EXPECT_EQ(books.stats().allocated_bytes.current, 0);
  EXPECT_EQ(books.stats().active_bytes.current, 4096);
  EXPECT_EQ(books.tag_stats()[1].bytes.current, 0);
  EXPECT_EQ(books.tag_stats()[1].bytes.peak, 4096);
  books.free_completed(block);
  EXPECT_EQ(books.stats().active_bytes.current, 0);
  EXPECT_EQ(actions(books),
            (std::vector<TraceAction>{TraceAction::alloc, TraceAction::free_requested, TraceAction::free_completed}));
  EXPECT_EQ(books.trace().events().back().stream, 7u);
}

TEST(Ledger, AnImmediateFreeIsDoneAtOnce) {
  Ledger books(16);
  const Block block = live_block(0x3000, 512, 100, 2);
  books.allocated(block);
  books.freed(block, /*now=*/true);
  EXPECT_EQ(books.stats().active_bytes.current, 0);
  EXPECT_EQ(books.stats().requested_bytes.current, 0);
  EXPECT_EQ(books.stats().allocations.peak, 1);
  EXPECT_EQ(actions(books),
            (std::vector<TraceAction>{TraceAction::alloc, TraceAction::free_requested, TraceAction::free_completed}));
  EXPECT_TRUE(books.live_requested_by_tag().empty());
}

TEST(Ledger, ReservedMemoryAndSegmentsAreCountedApart) {
  Ledger books(16);
  books.reserved(0x10000, 2 << 20, 0, /*small=*/false, 5);
  books.segment_opened(/*small=*/false, /*oversize=*/true);
  books.reserved(0x210000, 2 << 20, 0, false, 5);  // pages mapped into the same expandable segment
  EXPECT_EQ(books.reserved_bytes(), std::size_t{4} << 20);
  EXPECT_EQ(books.stats().segments.current, 1);
  EXPECT_EQ(books.stats().pool(PoolKind::large).segments.current, 1);
  EXPECT_EQ(books.stats().pool(PoolKind::small).reserved_bytes.current, 0);
  EXPECT_EQ(books.stats().oversize_segments.current, 1);
  books.released(0x10000, 4 << 20, 0, false);
  books.segment_closed(false, true);
  EXPECT_EQ(books.reserved_bytes(), 0u);
  EXPECT_EQ(books.stats().reserved_bytes.peak, 4 << 20);
  EXPECT_EQ(books.stats().pool(PoolKind::large).reserved_bytes.total_subtracted(), 4u << 20);
  EXPECT_EQ(books.stats().segments.current, 0);
  EXPECT_EQ(books.stats().oversize_segments.total_subtracted(), 1u);
  EXPECT_EQ(actions(books), (std::vector<TraceAction>{TraceAction::segment_alloc, TraceAction::segment_alloc,
                                                      TraceAction::segment_free}));
  EXPECT_EQ(books.trace().events()[0].tag, 5u);
  EXPECT_EQ(books.trace().events()[2].tag, 0u);
}

TEST(Ledger, FailuresAreCountedAndOnlyPoolFailuresTraced) {
  Ledger books(16);
  books.retried();
  books.out_of_memory(20 << 20, 19 << 20, 0, 4);
  books.impossible_request();
  books.invalid_free();
  EXPECT_EQ(books.stats().num_alloc_retries, 1);
  EXPECT_EQ(books.stats().num_ooms, 2);
  EXPECT_EQ(books.stats().num_invalid_frees, 1);
  const auto events = books.trace().events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].action, TraceAction::oom);
  EXPECT_EQ(events[0].size, std::uint64_t{20} << 20);
  EXPECT_EQ(events[0].requested, std::uint64_t{19} << 20);
}

TEST(Ledger, ResettingPeaksKeepsCurrentFiguresAndTagsThatAllocated) {
  Ledger books(16);
  const Block first = live_block(0x1000, 2048, 2048, 1);
  books.allocated(first);
  books.allocated(live_block(0x2000, 512, 500, 2));
  books.freed(first, /*now=*/true);
  books.reset_peaks();
  EXPECT_EQ(books.stats().allocated_bytes.peak, 512);
  EXPECT_EQ(books.tag_stats()[1].bytes.peak, 0);
  EXPECT_EQ(books.tag_stats()[2].bytes.peak, 512);
  const auto tags = books.tags_that_allocated();
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, 1u);
  EXPECT_EQ(tags[1].tag, 2u);
  EXPECT_EQ(books.live_requested_by_tag(), (std::vector<std::pair<TagId, std::int64_t>>{{2, 500}}));
}

TEST(Ledger, ATraceOfNoEntriesRecordsNothingButTheFiguresStillCount) {
  Ledger books(16);
  books.resize_trace(0);
  books.allocated(live_block(0x1000, 512, 512, 0));
  EXPECT_TRUE(books.trace().events().empty());
  EXPECT_EQ(books.stats().allocated_bytes.current, 512);
}

}  // namespace
}  // namespace remat::alloc::detail
