// TaggingCudaAllocator, PyTorch's pluggable allocator over the tagging allocator, driven directly
// on the host backend: every memory call PyTorch's own pluggable class refuses is answered, and
// each answer is checked against the tagging allocator's own statistics and snapshot.

#include "tagging_cuda_allocator.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/tags.hpp>

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <stdexcept>

namespace remat::detail {
namespace {

namespace alloc = remat::alloc;
using Action = torch_alloc::TraceEntry::Action;
using c10::CachingAllocator::StatType;

constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kCapacityMiB = 64;

void* allocate(std::size_t bytes, int device, void* stream) {
  return alloc::device_allocator(device).allocate(bytes, reinterpret_cast<alloc::Stream>(stream));
}
void deallocate(void* ptr, std::size_t bytes, int device) noexcept {
  alloc::device_allocator(device).deallocate(ptr, bytes);
}
void record_stream(void*, void*) {}
void empty_cache() { alloc::device_allocator(0).empty_cache(); }
void set_memory_fraction(double fraction, int device) { alloc::set_memory_fraction(device, fraction); }

// A stack as a context recorder gathers it, numbered in gathering order.
struct NumberedContext : c10::GatheredContext {
  explicit NumberedContext(int n) : number(n) {}
  int number;
};
int g_gathered = 0;
std::shared_ptr<c10::GatheredContext> gather_numbered() { return std::make_shared<NumberedContext>(++g_gathered); }
int number_of(const std::shared_ptr<c10::GatheredContext>& context) {
  const auto* numbered = dynamic_cast<const NumberedContext*>(context.get());
  return numbered == nullptr ? 0 : numbered->number;
}

const c10::CachingAllocator::Stat& of(const c10::CachingAllocator::StatArray& stats, StatType type) {
  return stats[static_cast<std::size_t>(type)];
}

class TaggingCudaAllocatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    alloc::configure("backend:host,host_capacity_mb:" + std::to_string(kCapacityMiB) + ",trace_entries:4096");
  }

  void SetUp() override {
    alloc::CachingAllocator& device = alloc::device_allocator(0);
    ASSERT_EQ(device.stats().allocations.current, 0) << "a previous test leaked blocks";
    device.empty_cache();
    device.reset_accumulated_stats();
    device.reset_peak_stats();
  }

  void TearDown() override {
    for (void* ptr : live_) torch_allocator.raw_delete(ptr);
    torch_allocator.recordHistory(false, nullptr, 0, torch_alloc::RecordContext::NEVER, true, {});
    torch_allocator.setUserMetadata("");
    alloc::device_allocator(0).empty_cache();
  }

  void* take(std::size_t bytes) {
    void* ptr = torch_allocator.malloc(bytes, 0, nullptr);
    live_.push_back(ptr);
    return ptr;
  }
  void give_back(void* ptr) {
    live_.erase(std::find(live_.begin(), live_.end(), ptr));
    torch_allocator.raw_delete(ptr);
  }
  void record_all_history(torch_alloc::RecordContext when = torch_alloc::RecordContext::NEVER,
                          std::size_t max_entries = 1000, std::vector<std::string> skip = {}) {
    torch_allocator.recordHistory(true, when == torch_alloc::RecordContext::NEVER ? nullptr : gather_numbered,
                                  max_entries, when, true, skip);
  }
  std::vector<torch_alloc::TraceEntry> history() {
    torch_alloc::SnapshotInfo info = torch_allocator.snapshot({0, 0}, true);
    return info.device_traces.empty() ? std::vector<torch_alloc::TraceEntry>{} : info.device_traces[0];
  }
  // The history's block events, without the segments' (which depend on what earlier tests cached).
  std::vector<torch_alloc::TraceEntry> block_history() {
    std::vector<torch_alloc::TraceEntry> out;
    for (torch_alloc::TraceEntry& entry : history()) {
      if (entry.action_ != Action::SEGMENT_ALLOC && entry.action_ != Action::SEGMENT_FREE) out.push_back(entry);
    }
    return out;
  }

  TaggingCudaAllocator torch_allocator{{.allocate = allocate,
                                        .deallocate = deallocate,
                                        .record_stream = record_stream,
                                        .empty_cache = empty_cache,
                                        .set_memory_fraction = set_memory_fraction}};

 private:
  std::vector<void*> live_;
};

void expect_same(const c10::CachingAllocator::Stat& torch_stat, const alloc::Stat& ours, const char* what) {
  EXPECT_EQ(torch_stat.current, ours.current) << what;
  EXPECT_EQ(torch_stat.peak, ours.peak) << what;
  EXPECT_EQ(torch_stat.allocated, static_cast<std::int64_t>(ours.total_added)) << what;
  EXPECT_EQ(torch_stat.freed, static_cast<std::int64_t>(ours.total_subtracted())) << what;
}

TEST_F(TaggingCudaAllocatorTest, DeviceStatsAreTheAllocatorsOwnFiguresForTheDeviceAndEachPool) {
  void* small_a = take(1000);  // rounds to 1024 in a 2 MiB small segment
  take(1000);
  take(3 * kMiB);
  take(3 * kMiB);
  give_back(small_a);

  const c10::CachingDeviceAllocator::DeviceStats torch_stats = torch_allocator.getDeviceStats(0);
  const alloc::AllocatorStats ours = alloc::device_allocator(0).stats();
  const alloc::PoolStats& small = ours.pools[static_cast<std::size_t>(alloc::PoolKind::small)];
  const alloc::PoolStats& large = ours.pools[static_cast<std::size_t>(alloc::PoolKind::large)];

  EXPECT_EQ(of(torch_stats.allocated_bytes, StatType::AGGREGATE).current, static_cast<std::int64_t>(1024 + 6 * kMiB));
  EXPECT_EQ(of(torch_stats.allocated_bytes, StatType::SMALL_POOL).current, 1024);
  EXPECT_EQ(of(torch_stats.allocated_bytes, StatType::SMALL_POOL).peak, 2048);
  EXPECT_EQ(of(torch_stats.allocated_bytes, StatType::LARGE_POOL).current, static_cast<std::int64_t>(6 * kMiB));
  EXPECT_EQ(of(torch_stats.requested_bytes, StatType::SMALL_POOL).current, 1000);
  EXPECT_EQ(of(torch_stats.allocation, StatType::AGGREGATE).current, 3);
  EXPECT_EQ(of(torch_stats.allocation, StatType::AGGREGATE).allocated, 4);
  EXPECT_EQ(of(torch_stats.allocation, StatType::AGGREGATE).freed, 1);
  EXPECT_EQ(of(torch_stats.reserved_bytes, StatType::SMALL_POOL).current, static_cast<std::int64_t>(2 * kMiB));

  expect_same(of(torch_stats.allocated_bytes, StatType::AGGREGATE), ours.allocated_bytes, "allocated_bytes");
  expect_same(of(torch_stats.allocated_bytes, StatType::SMALL_POOL), small.allocated_bytes, "small allocated_bytes");
  expect_same(of(torch_stats.allocated_bytes, StatType::LARGE_POOL), large.allocated_bytes, "large allocated_bytes");
  expect_same(of(torch_stats.reserved_bytes, StatType::AGGREGATE), ours.reserved_bytes, "reserved_bytes");
  expect_same(of(torch_stats.reserved_bytes, StatType::LARGE_POOL), large.reserved_bytes, "large reserved_bytes");
  expect_same(of(torch_stats.active_bytes, StatType::AGGREGATE), ours.active_bytes, "active_bytes");
  expect_same(of(torch_stats.requested_bytes, StatType::AGGREGATE), ours.requested_bytes, "requested_bytes");
  expect_same(of(torch_stats.inactive_split_bytes, StatType::AGGREGATE), ours.inactive_split_bytes,
              "inactive_split_bytes");
  expect_same(of(torch_stats.inactive_split, StatType::SMALL_POOL), small.inactive_split, "small inactive_split");
  expect_same(of(torch_stats.segment, StatType::AGGREGATE), ours.segments, "segment");
  expect_same(of(torch_stats.active, StatType::AGGREGATE), ours.active_blocks, "active");
  EXPECT_EQ(torch_stats.num_device_alloc, static_cast<std::int64_t>(ours.segments.total_added));
  EXPECT_EQ(torch_stats.num_ooms, 0);
  EXPECT_EQ(torch_stats.max_split_size, 0);  // unlimited, as PyTorch reports it
}

TEST_F(TaggingCudaAllocatorTest, PeakAndAccumulatedResetsReachTheAllocator) {
  void* big = take(8 * kMiB);
  take(1 * kMiB);
  give_back(big);
  torch_allocator.resetPeakStats(0);
  EXPECT_EQ(of(torch_allocator.getDeviceStats(0).allocated_bytes, StatType::AGGREGATE).peak,
            static_cast<std::int64_t>(1 * kMiB));
  EXPECT_EQ(alloc::device_allocator(0).stats().allocated_bytes.peak, static_cast<std::int64_t>(1 * kMiB));

  torch_allocator.resetAccumulatedStats(0);
  const c10::CachingDeviceAllocator::DeviceStats after = torch_allocator.getDeviceStats(0);
  EXPECT_EQ(of(after.allocation, StatType::AGGREGATE).allocated, 0);
  EXPECT_EQ(of(after.allocation, StatType::AGGREGATE).freed, 0);
  EXPECT_EQ(of(after.allocation, StatType::AGGREGATE).current, 1);  // what is live stays counted
  take(512);
  EXPECT_EQ(of(torch_allocator.getDeviceStats(0).allocation, StatType::AGGREGATE).allocated, 1);
}

TEST_F(TaggingCudaAllocatorTest, SnapshotHoldsEverySegmentAndBlockOfTheAllocatorsSnapshot) {
  void* a = take(1000);
  take(5000);
  take(3 * kMiB);
  give_back(a);
  const torch_alloc::SnapshotInfo info = torch_allocator.snapshot({0, 0}, true);
  const alloc::AllocatorSnapshot ours = alloc::device_allocator(0).snapshot();
  ASSERT_EQ(info.segments.size(), ours.segments.size());
  for (std::size_t s = 0; s < ours.segments.size(); ++s) {
    const torch_alloc::SegmentInfo& segment = info.segments[s];
    EXPECT_EQ(segment.address, ours.segments[s].address);
    EXPECT_EQ(segment.total_size, ours.segments[s].total_size);
    EXPECT_EQ(segment.is_large, !ours.segments[s].is_small);
    EXPECT_EQ(segment.device, 0);
    ASSERT_EQ(segment.blocks.size(), ours.segments[s].blocks.size());
    for (std::size_t b = 0; b < segment.blocks.size(); ++b) {
      const alloc::BlockInfo& block = ours.segments[s].blocks[b];
      EXPECT_EQ(segment.blocks[b].size, block.size);
      EXPECT_EQ(segment.blocks[b].requested_size, block.requested_size);
      EXPECT_EQ(segment.blocks[b].allocated, block.state == alloc::BlockState::active_allocated);
    }
  }
  // The small segment: the freed 1 KiB, the 5000-byte block (5120), and the rest of 2 MiB.
  const torch_alloc::SegmentInfo& small = info.segments[0].is_large ? info.segments[1] : info.segments[0];
  EXPECT_EQ(small.allocated_size, 5120u);
  EXPECT_EQ(small.requested_size, 5000u);
  // History was never switched on: the trace is what the ring recorded since the allocator was made.
  ASSERT_EQ(info.device_traces.size(), 1u);
  std::map<Action, int> actions;
  for (const torch_alloc::TraceEntry& entry : info.device_traces[0]) ++actions[entry.action_];
  EXPECT_EQ(actions[Action::ALLOC], 3);
  EXPECT_EQ(actions[Action::FREE_REQUESTED], 1);
  EXPECT_EQ(actions[Action::SEGMENT_ALLOC], 2);
  EXPECT_TRUE(torch_allocator.snapshot({7, 1}, true).segments.empty()) << "nothing lives in a private pool";
}

TEST_F(TaggingCudaAllocatorTest, HistoryHoldsTheEventsSinceItWasSwitchedOnWithTheirTagsAsUserMetadata) {
  take(2048);  // before history was switched on (and cleared): not in it
  EXPECT_FALSE(torch_allocator.isHistoryEnabled());
  record_all_history();
  EXPECT_TRUE(torch_allocator.isHistoryEnabled());
  void* tagged = nullptr;
  {
    auto region = alloc::TagScope::region("layers.0", alloc::Policy::save);
    auto phase = alloc::TagScope::phase(alloc::Phase::forward);
    tagged = take(4096);
  }
  give_back(tagged);

  const std::vector<torch_alloc::TraceEntry> entries = block_history();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].action_, Action::ALLOC);
  EXPECT_EQ(entries[0].addr_, reinterpret_cast<std::size_t>(tagged));
  EXPECT_EQ(entries[0].size_, 4096u);
  EXPECT_EQ(entries[0].user_metadata_, R"({"region":"layers.0","policy":"save","phase":"forward"})");
  EXPECT_EQ(entries[1].action_, Action::FREE_REQUESTED);
  EXPECT_EQ(entries[2].action_, Action::FREE_COMPLETED);
  EXPECT_EQ(entries[2].user_metadata_, entries[0].user_metadata_);
  EXPECT_GT(entries[0].time_.t_, 1'600'000'000'000'000) << "microseconds since the Unix epoch";
  EXPECT_LE(entries[0].time_.t_, entries[2].time_.t_);

  EXPECT_TRUE(torch_allocator.snapshot({0, 0}, false).device_traces.empty());
  torch_allocator.recordHistory(false, nullptr, 0, torch_alloc::RecordContext::NEVER, false, {});
  EXPECT_TRUE(history().empty()) << "history switched off holds nothing";
}

TEST_F(TaggingCudaAllocatorTest, HistoryKeepsTheLastMaxEntriesAndLeavesOutSkippedActions) {
  take(512);  // the small segment exists before history starts: the history is block events only
  record_all_history(torch_alloc::RecordContext::NEVER, 4, {"free_completed"});
  for (int i = 0; i < 5; ++i) give_back(take(512 * (i + 1)));
  const std::vector<torch_alloc::TraceEntry> entries = history();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].action_, Action::ALLOC);
  EXPECT_EQ(entries[0].size_, 2048u);
  EXPECT_EQ(entries[3].action_, Action::FREE_REQUESTED);
  EXPECT_EQ(entries[3].size_, 2560u);

  EXPECT_THROW(record_all_history(torch_alloc::RecordContext::NEVER, 10, {"rewind"}), c10::Error);
}

TEST_F(TaggingCudaAllocatorTest, PyTorchsDefaultUnlimitedMaxEntriesGrowsTheRingToItsCap) {
  // torch.cuda.memory._record_memory_history() passes sys.maxsize.
  record_all_history(torch_alloc::RecordContext::NEVER, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(alloc::current_config().trace_entries, std::size_t{1} << 20);
  void* block = take(4096);
  give_back(block);
  EXPECT_EQ(block_history().size(), 3u);
  alloc::configure("trace_entries:4096");
}

TEST_F(TaggingCudaAllocatorTest, GatheredStacksGoToLiveBlocksAndToTheTraceEntriesTheModeAsksFor) {
  record_all_history(torch_alloc::RecordContext::ALLOC);
  const int first = g_gathered + 1;
  void* kept = take(1024);
  void* freed = take(1536);
  give_back(freed);

  const torch_alloc::SnapshotInfo info = torch_allocator.snapshot({0, 0}, true);
  std::map<std::size_t, int> block_stacks;
  for (const torch_alloc::SegmentInfo& segment : info.segments) {
    std::size_t address = segment.address;
    for (const torch_alloc::BlockInfo& block : segment.blocks) {
      if (block.allocated) block_stacks[address] = number_of(block.context_when_allocated);
      address += block.size;
    }
  }
  EXPECT_EQ(block_stacks.at(reinterpret_cast<std::size_t>(kept)), first);
  const std::vector<torch_alloc::TraceEntry> entries = block_history();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(number_of(entries[0].context_), first);
  EXPECT_EQ(number_of(entries[1].context_), first + 1);
  EXPECT_EQ(number_of(entries[2].context_), 0) << "ALLOC gathers no stack at free";

  record_all_history(torch_alloc::RecordContext::ALL);
  void* again = take(1024);
  give_back(again);
  const std::vector<torch_alloc::TraceEntry> all = block_history();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(number_of(all[0].context_), first + 2);
  EXPECT_EQ(number_of(all[1].context_), first + 3) << "ALL gathers a stack at free too";
}

TEST_F(TaggingCudaAllocatorTest, UserMetadataLabelsAllocationsInBothSnapshots) {
  record_all_history();
  torch_allocator.setUserMetadata("step 3");
  EXPECT_EQ(torch_allocator.getUserMetadata(), "step 3");
  void* labelled = take(4096);
  torch_allocator.setUserMetadata("");
  take(4096);

  const std::optional<alloc::TagId> tag = alloc::device_allocator(0).tag_of_block(labelled);
  ASSERT_TRUE(tag.has_value());
  EXPECT_EQ(alloc::name_of(alloc::tag_of(*tag).label), "step 3");
  const std::vector<torch_alloc::TraceEntry> entries = block_history();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].user_metadata_, "step 3");
  EXPECT_EQ(entries[1].user_metadata_, "");
  EXPECT_EQ(torch_allocator.getUserMetadata(), "");
}

TEST_F(TaggingCudaAllocatorTest, ARetagIsNoHistoryEntryAndLaterEntriesOfTheBlockCarryItsNewCategory) {
  // remat_alloc.track re-tags what exists (a parameter at track, an activation at its pack): PyTorch
  // has no action for that, so the history keeps the alloc with the tag it was made with.
  record_all_history();
  void* weight = take(4096);
  ASSERT_TRUE(alloc::retag_category(weight, alloc::Category::parameter, "layers.0.weight"));
  give_back(weight);
  const std::vector<torch_alloc::TraceEntry> entries = block_history();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].action_, Action::ALLOC);
  EXPECT_EQ(entries[0].user_metadata_, "");
  EXPECT_EQ(entries[1].action_, Action::FREE_REQUESTED);
  EXPECT_EQ(entries[1].user_metadata_, R"({"category":"parameter","module":"layers.0.weight"})");
  EXPECT_EQ(entries[2].action_, Action::FREE_COMPLETED);
}

TEST_F(TaggingCudaAllocatorTest, AnnotationsAreKeptWhileHistoryIsOn) {
  torch_allocator.recordAnnotation({{"name", "ignored"}});
  record_all_history();
  torch_allocator.recordAnnotation({{"name", "forward"}, {"stage", "START"}});
  const torch_alloc::SnapshotInfo info = torch_allocator.snapshot({0, 0}, true);
  ASSERT_EQ(info.external_annotations.size(), 1u);
  EXPECT_EQ(info.external_annotations[0].metadata_.at("name"), "forward");
  EXPECT_EQ(info.external_annotations[0].metadata_.at("stage"), "START");
}

TEST_F(TaggingCudaAllocatorTest, OutOfMemoryObserversGetPyTorchsArguments) {
  struct Seen {
    std::int64_t device = -1;
    std::size_t allocated = 0, total = 0, free = 0;
    int calls = 0;
  };
  auto seen = std::make_shared<Seen>();
  torch_allocator.attachOutOfMemoryObserver(
      [seen](std::int64_t device, std::size_t allocated, std::size_t total, std::size_t free) {
        *seen = {device, allocated, total, free, seen->calls + 1};
      });
  take(40 * kMiB);
  EXPECT_THROW(take(40 * kMiB), alloc::OutOfMemoryError);
  EXPECT_EQ(seen->calls, 1);
  EXPECT_EQ(seen->device, 0);
  EXPECT_EQ(seen->allocated, 40 * kMiB);
  EXPECT_EQ(seen->total, kCapacityMiB * kMiB);
  EXPECT_EQ(seen->free, (kCapacityMiB - 40) * kMiB);
  EXPECT_EQ(torch_allocator.getDeviceStats(0).num_ooms, 1);
}

TEST_F(TaggingCudaAllocatorTest, CacheInfoMemoryFractionAndExpandableSegmentsAreTheAllocators) {
  void* cached = take(6 * kMiB);
  take(2 * kMiB);
  give_back(cached);  // a 6 MiB free block in a 20 MiB segment, and 12 MiB free after the 2 MiB one
  std::size_t largest = 1;
  torch_allocator.cacheInfo(0, &largest);
  EXPECT_EQ(largest, 12 * kMiB);
  largest = 0;  // PyTorch's zero guess starts from the device's free memory
  torch_allocator.cacheInfo(0, &largest);
  EXPECT_EQ(largest, (kCapacityMiB - 20) * kMiB);

  EXPECT_EQ(torch_allocator.getMemoryFraction(0), 1.0);
  alloc::set_memory_fraction(0, 0.5);
  EXPECT_EQ(torch_allocator.getMemoryFraction(0), 0.5);
  alloc::set_memory_fraction(0, 1.0);
  EXPECT_TRUE(torch_allocator.getExpandableSegmentSizes(0).empty());
}

TEST_F(TaggingCudaAllocatorTest, ExpandableSegmentSizesListEachExpandableSegment) {
  alloc::configure("expandable_segments:True");
  take(3 * kMiB);
  const std::vector<torch_alloc::StreamSegmentSize> sizes = torch_allocator.getExpandableSegmentSizes(0);
  alloc::configure("expandable_segments:False");
  ASSERT_EQ(sizes.size(), 1u);
  EXPECT_FALSE(sizes[0].is_small_pool);
  EXPECT_EQ(sizes[0].total_size, alloc::device_allocator(0).snapshot().segments.at(0).total_size);
}

}  // namespace
}  // namespace remat::detail
