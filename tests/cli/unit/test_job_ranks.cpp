// A job's ranks gathered from their figures: medians, equal ranks as ranges, the missing ranks,
// a rank's snapshot and OOM dumps merged, and the dumps refused.
#include "ranks/job_ranks.hpp"

#include <gtest/gtest.h>

namespace remat::report {
namespace {

RankFigures snapshot_rank(std::uint64_t rank, std::uint64_t peak, std::vector<GroupBytes> groups = {}) {
  RankFigures figures;
  figures.rank = rank;
  figures.path = "snapshot-rank" + std::to_string(rank) + ".json";
  figures.peak_allocated_bytes = peak;
  figures.peak_reserved_bytes = 2 * peak;
  figures.device_total_bytes = 1000;
  figures.groups = std::move(groups);
  return figures;
}

RankFigures oom_rank(std::uint64_t rank, std::int64_t time_us, std::uint64_t allocated) {
  RankFigures figures;
  figures.rank = rank;
  figures.path = "oom-" + std::to_string(rank) + "-" + std::to_string(time_us) + ".json";
  figures.source = RankSource::oom;
  figures.peak_allocated_bytes = allocated;
  figures.ooms = 1;
  figures.first_oom = OomFailure{time_us, true, 64, figures.path};
  return figures;
}

TEST(JobRanks, MedianOfAnEvenCountIsTheMeanOfTheMiddleTwo) {
  JobRanks job;
  for (std::uint64_t rank = 0; rank < 4; ++rank) ASSERT_FALSE(job.add(snapshot_rank(rank, (rank + 1) * 101)));
  EXPECT_EQ(job.median_peak_allocated(), (202 + 303) / 2);
  EXPECT_EQ(job.median_peak_reserved(), 505);
  EXPECT_DOUBLE_EQ(*job.imbalance(), 404.0 / 252.0);
  EXPECT_EQ(job.by_peak().front()->rank, 3u);
}

TEST(JobRanks, ImbalanceIsUnknownWhenTheMedianIsZero) {
  JobRanks job;
  ASSERT_FALSE(job.add(snapshot_rank(0, 0)));
  EXPECT_FALSE(job.imbalance());
}

TEST(JobRanks, MissingRanksAreRangesFromZeroToTheHighest) {
  JobRanks job;
  for (const std::uint64_t rank : {2, 3, 5, 9}) ASSERT_FALSE(job.add(snapshot_rank(rank, 10)));
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> expected = {{0, 1}, {4, 4}, {6, 8}};
  EXPECT_EQ(job.missing_ranks(), expected);
  EXPECT_EQ(ranges_text(job.missing_ranks()), "0-1, 4, 6-8");
  EXPECT_EQ(ranges_text(rank_ranges({0, 1, 2, 3, 8, 10, 11})), "0-3, 8, 10-11");
  EXPECT_EQ(ranges_text(rank_ranges({0, 4, 8, 9, 12, 16}), 2), "0, 4, ..., 16 (6 ranks)");
}

TEST(JobRanks, ASecondSnapshotForARankIsRefusedNamingTheFirst) {
  JobRanks job;
  ASSERT_FALSE(job.add(snapshot_rank(1, 10)));
  const std::optional<std::string> refused = job.add(snapshot_rank(1, 20));
  ASSERT_TRUE(refused);
  EXPECT_NE(refused->find("rank 1 is already read from snapshot-rank1.json"), std::string::npos) << *refused;
  EXPECT_EQ(job.ranks().at(1).peak_allocated_bytes, 10u);
  EXPECT_EQ(job.dumps_read(), 1u);
}

TEST(JobRanks, OomDumpsJoinTheirRanksSnapshotAndTheEarliestFailureCounts) {
  JobRanks job;
  ASSERT_FALSE(job.add(oom_rank(0, 500, 7)));  // before the snapshot: its bytes stand in for the peaks
  EXPECT_EQ(job.ranks().at(0).source, RankSource::oom);
  EXPECT_EQ(job.ranks().at(0).peak_allocated_bytes, 7u);
  ASSERT_FALSE(job.add(snapshot_rank(0, 40)));
  ASSERT_FALSE(job.add(oom_rank(0, 300, 9)));
  const RankRow& row = job.ranks().at(0);
  EXPECT_EQ(row.source, RankSource::snapshot);
  EXPECT_EQ(row.peak_allocated_bytes, 40u);
  EXPECT_EQ(row.oom_dumps.size(), 2u);
  EXPECT_EQ(row.first_oom->time_us, 300);
  const std::optional<std::string> again = job.add(oom_rank(0, 300, 9));
  ASSERT_TRUE(again);
  EXPECT_NE(again->find("the same dump twice"), std::string::npos) << *again;
}

TEST(JobRanks, FirstFailureOrdersTheFailedByTimeThenTheRestByHeadroom) {
  JobRanks job;
  ASSERT_FALSE(job.add(oom_rank(2, 1000, 5)));
  ASSERT_FALSE(job.add(oom_rank(0, 400, 5)));
  ASSERT_FALSE(job.add(snapshot_rank(1, 100)));  // reserved 200 of 1000
  ASSERT_FALSE(job.add(snapshot_rank(3, 300)));  // reserved 600 of 1000
  const std::optional<FirstFailure> first = job.first_failure();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rank, 0u);
  ASSERT_EQ(first->others.size(), 3u);
  EXPECT_EQ(first->others[0].rank, 2u);
  EXPECT_EQ(*first->others[0].failed_after_us, 600);
  EXPECT_EQ(first->others[1].rank, 3u);
  EXPECT_EQ(*first->others[1].headroom_bytes, 400u);
  EXPECT_EQ(first->others[2].rank, 1u);
  EXPECT_EQ(*first->others[2].headroom_bytes, 800u);
}

TEST(JobRanks, SpreadsCountARankWithoutTheGroupAsZero) {
  JobRanks job;
  const GroupLabel recv = GroupLabel::name("stage 1 F slot 0");
  const GroupLabel untagged = GroupLabel::own("(untagged)");
  ASSERT_FALSE(job.add(snapshot_rank(0, 10, {{untagged, 10, std::nullopt}})));
  ASSERT_FALSE(job.add(snapshot_rank(1, 50, {{recv, 40, std::nullopt}, {untagged, 10, std::nullopt}})));
  ASSERT_FALSE(job.add(snapshot_rank(2, 30, {{recv, 20, std::nullopt}, {untagged, 10, std::nullopt}})));
  const std::vector<GroupSpread> spreads = job.spreads();
  ASSERT_EQ(spreads.size(), 2u);
  EXPECT_EQ(job.labels()[spreads[0].id], recv);
  EXPECT_EQ(spreads[0].min_bytes, 0u);
  EXPECT_EQ(spreads[0].median_bytes, 20u);
  EXPECT_EQ(spreads[0].max_bytes, 40u);
  EXPECT_EQ(spreads[0].max_rank, 1u);
  EXPECT_EQ(spreads[0].ranks_with_group, 2u);
  EXPECT_EQ(spreads[1].max_rank, 0u);  // equal on every rank: the lowest holds the max
  EXPECT_EQ(spreads[1].ranks_with_group, 3u);
}

}  // namespace
}  // namespace remat::report
