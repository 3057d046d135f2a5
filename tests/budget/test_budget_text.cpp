// Budgets written as text: the units people use for device memory, and every ambiguous or
// impossible form refused with the forms accepted.

#include <remat/budget/budget_text.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace remat::budget {
namespace {

std::string refusal(const std::string& text) {
  try {
    parse_budget(text, "budget");
  } catch (const BudgetError& error) {
    return error.what();
  }
  return "accepted";
}

TEST(BudgetText, BinaryAndDecimalUnitsAreTheirOwnUnits) {
  EXPECT_EQ(parse_budget("70GiB", "budget"), 70ULL << 30);
  EXPECT_EQ(parse_budget("70GB", "budget"), 70'000'000'000ULL);
  EXPECT_EQ(parse_budget("512 MiB", "budget"), 512ULL << 20);
  EXPECT_EQ(parse_budget(" 4kB ", "budget"), 4000u);
  EXPECT_EQ(parse_budget("1703936B", "budget"), 1703936u);
  EXPECT_EQ(parse_budget("3TiB", "budget"), 3ULL << 40);
  EXPECT_EQ(parse_budget("2PB", "budget"), 2'000'000'000'000'000ULL);
}

TEST(BudgetText, AFractionIsExactWhenItIsWholeBytesAndRoundedDownWhenNot) {
  EXPECT_EQ(parse_budget("1.5GiB", "budget"), 3ULL << 29);
  EXPECT_EQ(parse_budget("0.25KiB", "budget"), 256u);
  EXPECT_EQ(parse_budget("2.000B", "budget"), 2u);
  EXPECT_EQ(parse_budget(".5kB", "budget"), 500u);
  EXPECT_NE(refusal("0.5B").find("a fraction of a byte"), std::string::npos) << refusal("0.5B");
  EXPECT_EQ(parse_budget("1.1KiB", "budget"), 1126u);        // 1126.4
  EXPECT_EQ(parse_budget("0.1 GiB", "budget"), 107374182u);  // 107374182.4
  EXPECT_EQ(parse_budget("2.6 MiB", "budget"), 2726297u);    // 2726297.6
  EXPECT_NE(refusal("0.0001KiB").find("zero bytes"), std::string::npos) << refusal("0.0001KiB");  // 0.1024 B
}

TEST(BudgetText, ANumberWithoutAUnitIsRefusedNamingTheFormsAccepted) {
  const std::string message = refusal("70");
  EXPECT_NE(message.find("budget '70': no unit"), std::string::npos) << message;
  EXPECT_NE(message.find("70GiB, 512 MiB"), std::string::npos) << message;
  EXPECT_NE(message.find("80GB is 80 x 10^9 bytes"), std::string::npos) << message;
}

TEST(BudgetText, ZeroSignsUnknownUnitsAndNonsenseAreRefused) {
  EXPECT_NE(refusal("0GiB").find("zero bytes"), std::string::npos);
  EXPECT_NE(refusal("0B").find("zero bytes"), std::string::npos);
  EXPECT_NE(refusal("-5GiB").find("no sign"), std::string::npos);
  EXPECT_NE(refusal("+5GiB").find("no sign"), std::string::npos);
  EXPECT_NE(refusal("9KB").find("unknown unit 'KB'"), std::string::npos) << refusal("9KB");
  EXPECT_NE(refusal("70gib").find("unknown unit 'gib'"), std::string::npos);
  EXPECT_NE(refusal("nan").find("not a number"), std::string::npos) << refusal("nan");
  EXPECT_NE(refusal("").find("empty"), std::string::npos);
  EXPECT_NE(refusal(".GiB").find("not a number"), std::string::npos);
  EXPECT_NE(refusal("1e9B").find("unknown unit 'e9B'"), std::string::npos) << refusal("1e9B");
  EXPECT_NE(refusal("7\x01GiB").find("'7\\x01GiB'"), std::string::npos) << refusal("7\x01GiB");
}

// A host budget of zero, with a unit too, means no offload; the rest is read as a budget is.
TEST(BudgetText, AHostBudgetOfZeroIsAcceptedWithAUnit) {
  EXPECT_EQ(parse_host_budget("0B", "--host-budget"), 0u);
  EXPECT_EQ(parse_host_budget("0 GiB", "--host-budget"), 0u);
  EXPECT_EQ(parse_host_budget("0.0001KiB", "--host-budget"), 0u);  // 0.1024 B, rounded down
  EXPECT_EQ(parse_host_budget("1.5GiB", "--host-budget"), 1610612736u);
  EXPECT_THROW(parse_host_budget("0", "--host-budget"), BudgetError);  // no unit
  EXPECT_THROW(parse_host_budget("-1GiB", "--host-budget"), BudgetError);
  EXPECT_THROW(parse_budget("0 GiB", "--budget"), BudgetError);  // a device budget of zero still is not
}

TEST(BudgetText, MoreThanTheLargestByteCountIsRefused) {
  EXPECT_EQ(parse_budget("18446744073709551615B", "budget"), ~std::uint64_t{0});
  EXPECT_NE(refusal("18446744073709551616B").find("more than 2^64 - 1 bytes"), std::string::npos);
  EXPECT_NE(refusal("16EiB").find("unknown unit"), std::string::npos);
  EXPECT_NE(refusal("16384PiB").find("more than 2^64 - 1 bytes"), std::string::npos);
  EXPECT_NE(refusal("99999999999999999999999GiB").find("more than 2^64 - 1 bytes"), std::string::npos);
}

}  // namespace
}  // namespace remat::budget
