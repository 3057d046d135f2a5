// UTC text for instants, as dump headers, OOM dump names and remat-report ranks print them.
#include <remat/alloc/utc_time.hpp>

#include <gtest/gtest.h>

namespace remat::alloc {
namespace {

TEST(UtcTime, IsoTextToTheSecondOrMicrosecond) {
  const std::int64_t instant = 1'795'000'000'000'123;  // 2026-11-18T11:06:40.000123Z
  EXPECT_EQ(utc_text(instant, false), "2026-11-18T11:06:40Z");
  EXPECT_EQ(utc_text(instant, true), "2026-11-18T11:06:40.000123Z");
  EXPECT_EQ(utc_file_stamp(instant), "20261118T110640.000123Z");
  EXPECT_EQ(utc_text(0, true), "1970-01-01T00:00:00.000000Z");
}

TEST(UtcTime, AnInstantBefore1970RoundsItsSecondsDown) {
  EXPECT_EQ(utc_text(-1, true), "1969-12-31T23:59:59.999999Z");
  EXPECT_EQ(utc_text(-1'500'000, true), "1969-12-31T23:59:58.500000Z");
}

TEST(UtcTime, NowIsAfterThisCodeWasWritten) {
  EXPECT_GT(now_us(), 1'795'000'000'000'000);
  EXPECT_EQ(utc_text(now_us(), false).size(), 20u);
}

}  // namespace
}  // namespace remat::alloc
