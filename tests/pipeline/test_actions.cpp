// Actions parse and print exactly as PyTorch's _Action: every type, the overlapped form, and
// malformed text refused with the text quoted.

#include <remat/pipeline/action.hpp>
#include <remat/pipeline/errors.hpp>

#include <gtest/gtest.h>

#include <string>

namespace remat::pipeline {
namespace {

TEST(Actions, EveryTypeRoundTripsThroughPyTorchsText) {
  for (const char* text : {"0F1", "1B0", "2I3", "2W3", "1RECV_F0", "0SEND_B2", "3UNSHARD", "3RESHARD", "0REDUCE_GRAD",
                           "1SEND_F12", "10RECV_B7", "(0F3;1B1)OVERLAP_F_B"}) {
    const std::optional<Action> action = parse_action(text);
    ASSERT_TRUE(action.has_value()) << text;
    EXPECT_EQ(to_string(*action), text);
  }
}

TEST(Actions, FieldsAreThoseOfTheText) {
  const Action recv = *parse_action(" 12RECV_F34 ");
  EXPECT_EQ(recv.stage, 12);
  EXPECT_EQ(recv.type, ActionType::recv_f);
  EXPECT_EQ(recv.microbatch, 34);
  EXPECT_FALSE(recv.is_compute());
  const Action unshard = *parse_action("3UNSHARD");
  EXPECT_FALSE(unshard.microbatch.has_value());
  const Action overlap = *parse_action("(0F3;1B1)OVERLAP_F_B");
  EXPECT_EQ(overlap.stage, -1);
  ASSERT_EQ(overlap.sub_actions.size(), 2u);
  EXPECT_EQ(overlap.sub_actions[1], *parse_action("1B1"));
  EXPECT_TRUE(overlap.is_compute());
}

TEST(Actions, AnEmptyCellIsNoAction) {
  EXPECT_FALSE(parse_action("").has_value());
  EXPECT_FALSE(parse_action("   ").has_value());
}

TEST(Actions, MalformedTextIsRefusedAndQuoted) {
  for (const char* text : {"F0", "0X1", "0F1x", "0SEND_X1", "(0F1;1B1", "(0F1)B", "0OVERLAP_F_B1", "99999999999F0"}) {
    try {
      parse_action(text);
      FAIL() << text << " was accepted";
    } catch (const PlanError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + text + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Actions, AnOverlapGroupOfNoActionsIsRefusedRatherThanReadAsStageMinusOne) {
  for (const char* text : {"()OVERLAP_F_B", "( ; ;)OVERLAP_F_B"}) {
    try {
      parse_action(text);
      FAIL() << text << " was accepted";
    } catch (const PlanError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + text +
                                           "' is not a pipeline action (an OVERLAP_F_B group "
                                           "of no actions)"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace remat::pipeline
