// The dumps' vocabulary: every enum's names read back to its values, the counts the readers walk
// match the enums (a value added without its count would be unreadable), and PyTorch's spellings
// land on ours.

#include <remat/alloc/names.hpp>

#include <gtest/gtest.h>

#include <set>
#include <string>

using namespace remat::alloc;

namespace {

// Names 0 to count - 1 are distinct and read back; the value at `count` has no name of its own
// (to_string falls back to "unknown" or to another value's name), so count is the enum's size.
template <typename Enum>
void expect_names_cover_the_enum() {
  const auto& names = names_of<Enum>();
  std::set<std::string_view> seen;
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_FALSE(names[i].empty()) << i;
    EXPECT_TRUE(seen.insert(names[i]).second) << "name " << names[i] << " twice";
    EXPECT_EQ(from_name<Enum>(names[i]), static_cast<Enum>(i)) << names[i];
  }
  const std::string_view past = to_string(static_cast<Enum>(names.size()));
  EXPECT_TRUE(past == "unknown" || seen.count(past) == 1)
      << "value " << names.size() << " is named " << past << ": raise the enum's count";
  EXPECT_EQ(from_name<Enum>("no such name"), std::nullopt);
}

}  // namespace

TEST(Names, EveryEnumOfTheDumpsReadsBackFromItsNames) {
  expect_names_cover_the_enum<Policy>();
  expect_names_cover_the_enum<Phase>();
  expect_names_cover_the_enum<Category>();
  expect_names_cover_the_enum<TraceAction>();
  expect_names_cover_the_enum<BlockState>();
}

TEST(Names, TheNamesAreTheOnesTheSchemasList) {
  EXPECT_EQ(std::string(names_of<Policy>()[2]), "recompute");
  EXPECT_EQ(std::string(names_of<Phase>()[4]), "offloaded");
  EXPECT_EQ(std::string(names_of<TraceAction>()[1]), "free_requested");
  EXPECT_EQ(std::string(names_of<BlockState>()[1]), "active_pending_free");
  EXPECT_EQ(std::string(names_of<Category>()[3]), "optimizer_state");
}

TEST(Names, PyTorchSpellingsMapOntoOurs) {
  EXPECT_EQ(trace_action_from_torch("segment_map"), TraceAction::segment_alloc);
  EXPECT_EQ(trace_action_from_torch("segment_unmap"), TraceAction::segment_free);
  EXPECT_EQ(trace_action_from_torch("free"), TraceAction::free_requested);
  EXPECT_EQ(trace_action_from_torch("free_completed"), TraceAction::free_completed);
  EXPECT_EQ(trace_action_from_torch("snapshot"), std::nullopt);
  EXPECT_EQ(block_state_from_torch("active_awaiting_free"), BlockState::active_pending_free);
  EXPECT_EQ(block_state_from_torch("inactive"), BlockState::inactive);
  EXPECT_EQ(block_state_from_torch("allocated"), std::nullopt);
}
