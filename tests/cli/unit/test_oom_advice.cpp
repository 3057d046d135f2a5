// What `remat-report oom` suggests, pinned on hand-made numbers: each suggestion appears exactly
// when the numbers support it and cites them.
#include "analysis/oom_advice.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace remat::report {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

// A 16 GiB device with 8 GiB allocated, nothing cached free, and a 64 MiB request.
OomNumbers quiet_numbers() {
  OomNumbers n;
  n.requested_bytes = 64 * kMiB;
  n.rounded_bytes = 64 * kMiB;
  n.segment_bytes = 64 * kMiB;
  n.memory.total_bytes = 16 * kGiB;
  n.memory.free_bytes = 32 * kMiB;
  n.reserved_bytes = 8 * kGiB;
  n.allocated_bytes = 8 * kGiB;
  n.active_bytes = 8 * kGiB;
  return n;
}

// A 50 MiB request the largest free block (30 MiB) cannot hold, with 80 MiB cached free, 70 of
// them in 5 free blocks inside split segments.
OomNumbers fragmented_numbers() {
  OomNumbers n = quiet_numbers();
  n.rounded_bytes = n.requested_bytes = 50 * kMiB;
  n.largest_free_block = 30 * kMiB;
  n.cached_free_bytes = 80 * kMiB;
  n.fragmented_free_bytes = 70 * kMiB;
  n.free_blocks_in_split_segments = 5;
  return n;
}

const Suggestion* find(const std::vector<Suggestion>& all, SuggestionKind kind) {
  const auto it = std::find_if(all.begin(), all.end(), [&](const Suggestion& s) { return s.kind == kind; });
  return it == all.end() ? nullptr : &*it;
}

TEST(OomAdvice, NoSuggestionWhenNoRuleIsSupportedByTheNumbers) {
  const std::vector<OomHolder> regions = {{"layers.0", 4 * kGiB, 10, 0}, {"<untagged>", 4 * kGiB, 3, 0}};
  EXPECT_TRUE(suggest(quiet_numbers(), regions, "max_split_size_mb:unlimited").empty());
}

TEST(OomAdvice, EmptyCacheSufficesWhenWholeFreeSegmentsCoverTheRoundedRequest) {
  OomNumbers n = quiet_numbers();
  n.releasable_bytes = 96 * kMiB;
  n.cached_free_bytes = 96 * kMiB;
  n.largest_free_block = 48 * kMiB;
  const std::vector<Suggestion> all = suggest(n, {}, "");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, SuggestionKind::empty_cache);
  EXPECT_EQ(all[0].frees, 96 * kMiB);
  EXPECT_NE(all[0].message.find("empty-cache would have freed 96.00 MiB"), std::string::npos) << all[0].message;
  EXPECT_NE(all[0].message.find("enough for this request of 64.00 MiB"), std::string::npos) << all[0].message;
}

TEST(OomAdvice, EmptyCacheIsNotSuggestedWhenReleasableFallsShortOfTheRequest) {
  OomNumbers n = quiet_numbers();
  n.releasable_bytes = 63 * kMiB;
  EXPECT_EQ(find(suggest(n, {}, ""), SuggestionKind::empty_cache), nullptr);
}

TEST(OomAdvice, FragmentationSuggestsMaxSplitSizeOfTheRoundedRequestInMiB) {
  OomNumbers n = fragmented_numbers();
  n.requested_bytes = 50 * kMiB - 100;
  n.releasable_bytes = 10 * kMiB;
  const std::vector<Suggestion> all = suggest(n, {}, "backend:cuda,max_split_size_mb:unlimited");
  ASSERT_EQ(all.size(), 1u);
  const Suggestion& s = all[0];
  EXPECT_EQ(s.kind, SuggestionKind::fragmentation);
  EXPECT_EQ(s.setting, "max_split_size_mb:50");
  EXPECT_EQ(s.frees, 70 * kMiB);
  EXPECT_NE(s.message.find("largest free block (30.00 MiB) is smaller than the request (50.00 MiB)"), std::string::npos)
      << s.message;
  EXPECT_NE(s.message.find("70.00 MiB of them in 5 free block(s) inside split segments"), std::string::npos)
      << s.message;
  EXPECT_NE(s.message.find("(now unlimited)"), std::string::npos) << s.message;
}

TEST(OomAdvice, FragmentationSettingIsAtLeast20MiBForSmallRequests) {
  OomNumbers n = quiet_numbers();
  n.requested_bytes = n.rounded_bytes = 12 * kMiB;
  n.largest_free_block = 8 * kMiB;
  n.cached_free_bytes = 24 * kMiB;
  n.fragmented_free_bytes = 24 * kMiB;
  n.free_blocks_in_split_segments = 4;
  const std::vector<Suggestion> all = suggest(n, {}, "");
  const Suggestion* s = find(all, SuggestionKind::fragmentation);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->setting, "max_split_size_mb:20");
  // Set to that or less already it changes nothing (it was advised "(now 20)"); set higher it does
  EXPECT_EQ(find(suggest(n, {}, "max_split_size_mb:20"), SuggestionKind::fragmentation), nullptr);
  EXPECT_NE(find(suggest(n, {}, "max_split_size_mb:64"), SuggestionKind::fragmentation), nullptr);
}

TEST(OomAdvice, ARequestUnder10MiBGetsNoMaxSplitSize) {
  // Requests of 1 to 10 MiB share segments of large_segment_size_mb and split them whatever
  // max_split_size_mb says: an 8 MiB request advised max_split_size_mb:20 failed the same with it
  OomNumbers n = quiet_numbers();
  n.requested_bytes = n.rounded_bytes = 8 * kMiB;
  n.largest_free_block = 4 * kMiB;
  n.cached_free_bytes = n.fragmented_free_bytes = 20 * kMiB;
  n.free_blocks_in_split_segments = 5;
  n.request_pool = alloc::PoolFreeSpace{false, 20 * kMiB, 20 * kMiB, 5};
  EXPECT_EQ(find(suggest(n, {}, ""), SuggestionKind::fragmentation), nullptr);
}

TEST(OomAdvice, PyTorchsAllocatorIsAdvisedItsOwnSettings) {
  const OomNumbers n = fragmented_numbers();
  const OomContext pytorch{.pytorch_allocator = true};
  const std::vector<Suggestion> split = suggest(n, {}, "", pytorch);
  const Suggestion* s = find(split, SuggestionKind::fragmentation);
  ASSERT_NE(s, nullptr);
  EXPECT_NE(s->message.find("set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:50"), std::string::npos) << s->message;
  // No large_segment_size_mb there: a 4 MiB request whose 20 MiB segment exceeds a 16 MiB device
  OomNumbers shared = quiet_numbers();
  shared.requested_bytes = shared.rounded_bytes = 4 * kMiB;
  shared.segment_bytes = 20 * kMiB;
  shared.memory.total_bytes = 16 * kMiB;
  shared.cause = alloc::OomCause::request_exceeds_device;
  const std::vector<Suggestion> all = suggest(shared, {}, "", pytorch);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].setting, "");
  EXPECT_NE(all[0].message.find("PyTorch's allocator has no setting that makes that segment smaller"),
            std::string::npos)
      << all[0].message;
}

TEST(OomAdvice, MemoryHeldByTheModelAndItsOptimizerIsNotAdvisedASmallerBatch) {
  // An OOM in the optimizer step with no activation left: a smaller batch failed the same
  OomNumbers n = quiet_numbers();
  n.allocated_bytes = n.active_bytes = n.reserved_bytes = 15 * kGiB;
  const OomContext context{.categories = {{"optimizer_state", 6 * kGiB, 10, 0},
                                          {"parameter", 4 * kGiB, 10, 0},
                                          {"gradient", 4 * kGiB, 10, 0},
                                          {"temporary", kGiB, 10, 0}}};
  const std::vector<Suggestion> bound = suggest(n, {}, "", context);
  const Suggestion* s = find(bound, SuggestionKind::reduce_batch);
  ASSERT_NE(s, nullptr);
  EXPECT_NE(s->message.find("parameters, gradients and optimizer state hold 93.3% of it: a smaller batch or more "
                            "recompute frees little"),
            std::string::npos)
      << s->message;
  const std::vector<Suggestion> without_categories = suggest(n, {}, "");
  const Suggestion* plain = find(without_categories, SuggestionKind::reduce_batch);
  ASSERT_NE(plain, nullptr);
  EXPECT_NE(plain->message.find("lower the batch size"), std::string::npos) << plain->message;
}

TEST(OomAdvice, NoFragmentationSuggestionWhenCachedFreeCannotCoverTheRequest) {
  OomNumbers n = quiet_numbers();
  n.largest_free_block = 8 * kMiB;
  n.cached_free_bytes = 40 * kMiB;
  n.fragmented_free_bytes = 40 * kMiB;
  EXPECT_EQ(find(suggest(n, {}, ""), SuggestionKind::fragmentation), nullptr);
}

TEST(OomAdvice, RecomputeNamesTheRegionHoldingTheMostSavedBytes) {
  const std::vector<OomHolder> regions = {
      {"layers.0", 3 * kGiB, 10, 512 * kMiB}, {"layers.1", 2 * kGiB, 10, kGiB}, {"<untagged>", 3 * kGiB, 2, 0}};
  const std::vector<Suggestion> all = suggest(quiet_numbers(), regions, "");
  const Suggestion* s = find(all, SuggestionKind::recompute_region);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->region, "layers.1");
  EXPECT_EQ(s->frees, kGiB);
  EXPECT_NE(s->message.find("switch region layers.1 to recompute: frees up to 1.00 GiB"), std::string::npos)
      << s->message;
  EXPECT_NE(s->message.find("12.5% of allocated"), std::string::npos) << s->message;
  EXPECT_NE(s->message.find("no more than this frees"), std::string::npos) << s->message;
}

TEST(OomAdvice, NearCapacitySuggestsALowerBatchSizeCitingTheShare) {
  OomNumbers n = quiet_numbers();
  n.allocated_bytes = 15 * kGiB;
  const std::vector<Suggestion> all = suggest(n, {}, "");
  const Suggestion* s = find(all, SuggestionKind::reduce_batch);
  ASSERT_NE(s, nullptr);
  EXPECT_NE(s->message.find("allocated (15.00 GiB) is 93.8% of the device (16.00 GiB)"), std::string::npos)
      << s->message;
}

TEST(OomAdvice, ARequestLargerThanTheDeviceGetsOnlyThatSuggestion) {
  OomNumbers n = quiet_numbers();
  n.requested_bytes = n.rounded_bytes = n.segment_bytes = 32 * kGiB;
  n.releasable_bytes = 64 * kGiB;  // nothing cached could help anyway
  const std::vector<OomHolder> regions = {{"layers.0", kGiB, 1, kGiB}};
  const std::vector<Suggestion> all = suggest(n, regions, "");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, SuggestionKind::request_exceeds_device);
  EXPECT_NE(all[0].message.find("the request alone (32.00 GiB) is larger than the whole device (16.00 GiB)"),
            std::string::npos)
      << all[0].message;
}

// Each rule checked against the cause that applied.

// A 16 GiB device capped at memory_fraction 0.0625 (1 GiB): 1000 MiB reserved, 950 MiB of it
// allocated, a 64 MiB segment needed, and 15 GiB free on the device.
OomNumbers capped_numbers() {
  OomNumbers n = quiet_numbers();
  n.cause = alloc::OomCause::memory_fraction_cap;
  n.memory_fraction = 0.0625;
  n.reserved_limit_bytes = kGiB;
  n.reserved_bytes = 1000 * kMiB;
  n.allocated_bytes = 950 * kMiB;
  n.active_bytes = 950 * kMiB;
  n.memory.free_bytes = 15 * kGiB;
  return n;
}

TEST(OomAdvice, TheMemoryFractionCapIsNamedWithItsBytesAndTheSettingToChange) {
  const std::vector<Suggestion> all = suggest(capped_numbers(), {}, "memory_fraction:0.0625");
  ASSERT_FALSE(all.empty());
  const Suggestion& s = all[0];
  EXPECT_EQ(s.kind, SuggestionKind::raise_memory_fraction);
  EXPECT_EQ(s.setting, "memory_fraction:0.07");  // (1000 + 64) MiB of 16 GiB, rounded up
  EXPECT_NE(s.message.find("the memory_fraction cap was reached"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("memory_fraction:0.0625 caps reserved memory at 1073741824 bytes (1.00 GiB)"),
            std::string::npos)
      << s.message;
  EXPECT_NE(s.message.find("while the device had 15.00 GiB free"), std::string::npos) << s.message;
}

TEST(OomAdvice, UnderTheCapNearCapacityIsMeasuredAgainstTheCap) {
  const auto all = suggest(capped_numbers(), {}, "");
  const Suggestion* s = find(all, SuggestionKind::reduce_batch);
  ASSERT_NE(s, nullptr);  // 950 MiB: 92.8% of the 1 GiB cap, 5.8% of the 16 GiB device
  EXPECT_NE(s->message.find("is 92.8% of the memory_fraction cap (1.00 GiB)"), std::string::npos) << s->message;
}

TEST(OomAdvice, ACapThatEvenTheWholeDeviceCannotLiftSaysSo) {
  OomNumbers n = capped_numbers();
  n.reserved_bytes = 16 * kGiB - 32 * kMiB;
  const std::vector<Suggestion> all = suggest(n, {}, "");
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all[0].kind, SuggestionKind::raise_memory_fraction);
  EXPECT_NE(all[0].message.find("even memory_fraction:1 would not hold"), std::string::npos) << all[0].message;
}

TEST(OomAdvice, AFullDeviceNeverMentionsMemoryFraction) {
  OomNumbers n = quiet_numbers();
  n.cause = alloc::OomCause::device_full;
  n.allocated_bytes = 15 * kGiB;
  for (const Suggestion& s : suggest(n, {{"layers.0", kGiB, 1, kGiB}}, "")) {
    EXPECT_NE(s.kind, SuggestionKind::raise_memory_fraction);
    EXPECT_EQ(s.message.find("memory_fraction"), std::string::npos) << s.message;
  }
}

TEST(OomAdvice, TheRecordedCauseDecidesForARequestWhoseSegmentExceedsTheDevice) {
  OomNumbers n = quiet_numbers();
  n.cause = alloc::OomCause::request_exceeds_device;
  n.requested_bytes = n.rounded_bytes = 16 * kGiB - 100 * 512;  // its 2 MiB-rounded segment does not fit
  n.segment_bytes = 16 * kGiB + 2 * kMiB;
  const std::vector<Suggestion> all = suggest(n, {}, "");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, SuggestionKind::request_exceeds_device);
}

// A 4 MiB request shares a 20 MiB segment (large_segment_size_mb) that a 16 MiB device cannot
// hold: the request fits, and the segment's setting is the fix (it read "the request alone
// (20.00 MiB) is larger than the whole device"); on an 8 MiB device no segment size fits.
TEST(OomAdvice, ASmallRequestWhoseSharedSegmentExceedsTheDeviceGetsTheSegmentSetting) {
  OomNumbers n = quiet_numbers();
  n.cause = alloc::OomCause::request_exceeds_device;
  n.requested_bytes = n.rounded_bytes = 4 * kMiB;
  n.segment_bytes = 20 * kMiB;
  n.memory.total_bytes = 16 * kMiB;
  std::vector<Suggestion> all = suggest(n, {}, "");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].setting, "large_segment_size_mb:10");
  EXPECT_NE(all[0].message.find("the request (4.00 MiB) goes into a 20.00 MiB segment, larger than the whole device "
                                "(16.00 MiB)"),
            std::string::npos)
      << all[0].message;
  n.memory.total_bytes = 8 * kMiB;
  all = suggest(n, {}, "");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].setting, "");
  EXPECT_NE(all[0].message.find("no setting makes that segment smaller than 10 MiB"), std::string::npos)
      << all[0].message;
}

TEST(OomAdvice, ACapWithASegmentNearTwoTo64NeverAdvisesASmallFraction) {
  OomNumbers n = capped_numbers();
  n.segment_bytes = UINT64_MAX;  // reserved + segment would wrap around to a few MiB
  const std::vector<Suggestion> all = suggest(n, {}, "");
  const Suggestion* s = find(all, SuggestionKind::raise_memory_fraction);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->setting, "memory_fraction:1");
  EXPECT_NE(s->message.find("even memory_fraction:1 would not hold the 16.00 EiB needed"), std::string::npos)
      << s->message;

  n.cause.reset();  // an older report: capped because reserved + segment passes the cap
  EXPECT_NE(find(suggest(n, {}, ""), SuggestionKind::raise_memory_fraction), nullptr);
}

TEST(OomAdvice, ARequestNearTwoTo64GetsNoMaxSplitSizeTheAllocatorWouldRefuse) {
  OomNumbers n = quiet_numbers();
  n.memory.total_bytes = 0;  // unknown: the request is not compared with the device
  n.requested_bytes = n.rounded_bytes = UINT64_MAX;
  n.cached_free_bytes = UINT64_MAX;
  n.fragmented_free_bytes = kGiB;
  n.free_blocks_in_split_segments = 3;
  // (need + 1 MiB - 1) wrapped to under 1 MiB and advised max_split_size_mb:20.
  EXPECT_EQ(find(suggest(n, {}, ""), SuggestionKind::fragmentation), nullptr);

  n.requested_bytes = n.rounded_bytes = kMaxMaxSplitSizeMb * kMiB;  // the largest the allocator accepts
  const std::vector<Suggestion> all = suggest(n, {}, "");
  const Suggestion* s = find(all, SuggestionKind::fragmentation);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->setting, "max_split_size_mb:1099511627776");
}

TEST(OomAdvice, FragmentationUnderAFullDeviceStillSuggestsMaxSplitSize) {
  OomNumbers n = fragmented_numbers();
  n.cause = alloc::OomCause::device_full;
  EXPECT_NE(find(suggest(n, {}, ""), SuggestionKind::fragmentation), nullptr);
}

TEST(OomAdvice, FreeBlocksOfTheOtherPoolNeverCountTowardTheRequest) {
  // 80 MiB cached free, 70 of them in split segments, but only 20 MiB in the large pool the
  // 50 MiB request goes to: the small pool's blocks could never hold it
  OomNumbers n = fragmented_numbers();
  n.largest_free_block = 12 * kMiB;
  n.free_blocks_in_split_segments = 900;
  n.request_pool = alloc::PoolFreeSpace{false, 20 * kMiB, 20 * kMiB, 3};
  EXPECT_EQ(find(suggest(n, {}, ""), SuggestionKind::fragmentation), nullptr);

  // The large pool alone holds enough, split: advised, citing that pool's figures
  n.request_pool = alloc::PoolFreeSpace{false, 60 * kMiB, 55 * kMiB, 6};
  const std::vector<Suggestion> all = suggest(n, {}, "");
  const Suggestion* s = find(all, SuggestionKind::fragmentation);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->frees, 55 * kMiB);
  EXPECT_NE(s->message.find("although 60.00 MiB sit cached and free in the large pool, 55.00 MiB of them in 6 free "
                            "block(s) inside split segments"),
            std::string::npos)
      << s->message;
}

TEST(OomAdvice, ARequestOfTheSmallPoolGetsNoMaxSplitSize) {
  // Small-pool segments (2 MiB) are always split: max_split_size_mb cannot help a 768 KiB request
  OomNumbers n = quiet_numbers();
  n.rounded_bytes = n.requested_bytes = 768 * 1024;
  n.largest_free_block = 512 * 1024;
  n.cached_free_bytes = n.fragmented_free_bytes = 4 * kMiB;
  n.free_blocks_in_split_segments = 10;
  EXPECT_EQ(find(suggest(n, {}, ""), SuggestionKind::fragmentation), nullptr);  // an older report
  n.request_pool = alloc::PoolFreeSpace{true, 4 * kMiB, 4 * kMiB, 10};
  EXPECT_EQ(find(suggest(n, {}, ""), SuggestionKind::fragmentation), nullptr);
}

}  // namespace
}  // namespace remat::report
