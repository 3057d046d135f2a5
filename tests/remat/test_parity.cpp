// Gradients with checkpointing are bitwise equal to those without; state hooks make
// randomness replay exactly; nothing leaks.

#include "support.hpp"
#include "transformer_block.hpp"

#include <any>

namespace {

using remat::testing::Block;
using remat::testing::gradients;
using remat::testing::zero_grads;

struct Policy {
  bool attention_saves;
  bool mlp_saves;
};

class TransformerParity : public ::testing::TestWithParam<Policy> {};

TEST_P(TransformerParity, GradientsAreBitwiseEqualToNoCheckpointing) {
  const Policy policy = GetParam();
  const Block block = Block::make();
  auto x = at::randn({2, 6, Block::D}).requires_grad_(true);

  block.mlp(block.attention(x)).pow(2).sum().backward();
  const auto expected = gradients(block, x);
  zero_grads(block, x);

  auto out = remat::checkpoint({.region_name = "layers.0"})([&](const at::Tensor& in) {
    auto y = remat::region([&](const at::Tensor& t) { return block.attention(t); }, "attention",
                           !policy.attention_saves)(in);
    return remat::region([&](const at::Tensor& t) { return block.mlp(t); }, "mlp", !policy.mlp_saves)(y);
  })(x);
  out.pow(2).sum().backward();
  const auto actual = gradients(block, x);
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(at::equal(actual[i], expected[i])) << "gradient " << i;
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, TransformerParity,
                         ::testing::Values(Policy{true, true}, Policy{true, false}, Policy{false, true},
                                           Policy{false, false}),
                         [](const auto& param_info) {
                           return std::string(param_info.param.attention_saves ? "SaveAttention" : "RecomputeAttention") +
                                  (param_info.param.mlp_saves ? "SaveMlp" : "RecomputeMlp");
                         });

// Gradients of the block with dropout 0.3 and no checkpointing, from seed 7; leaves the
// gradients zeroed for the run under test.
std::vector<at::Tensor> dropout_reference(const Block& block, const at::Tensor& x) {
  at::manual_seed(7);
  block.mlp(block.attention(x), 0.3).pow(2).sum().backward();
  auto expected = gradients(block, x);
  zero_grads(block, x);
  return expected;
}

TEST(StateHooks, DropoutWithTheRngHookGivesBitwiseEqualGradients) {
  const Block block = Block::make();
  auto x = at::randn({2, 6, Block::D}).requires_grad_(true);
  const auto expected = dropout_reference(block, x);

  at::manual_seed(7);
  auto out = remat::checkpoint({.region_name = "dropout", .recompute_state_hooks = {remat::cpu_rng_state_hook()}})(
      [&](const at::Tensor& in) {
        auto y = remat::region([&](const at::Tensor& t) { return block.attention(t); }, "attention", false)(in);
        return remat::region([&](const at::Tensor& t) { return block.mlp(t, 0.3); }, "mlp")(y);
      })(x);
  at::rand({3});  // the caller moves the generator on before backward
  out.pow(2).sum().backward();
  const auto actual = gradients(block, x);
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(at::equal(actual[i], expected[i])) << "gradient " << i;
}

// A region the code saves draws dropout once, so it needs no RNG hook as written; a budget plan
// may recompute it, and under a plan the runtime keeps the CPU generator's state itself.
TEST(StateHooks, APlanThatRecomputesASavedRegionWithDropoutDrawsForwardsMask) {
  using remat::budget::Choice;
  const Block block = Block::make();
  auto x = at::randn({2, 6, Block::D}).requires_grad_(true);
  const auto expected = dropout_reference(block, x);
  const auto plan = std::make_shared<remat::budget::RegionChoices>(
      std::vector<std::pair<std::string, Choice>>{{"planned-dropout::mlp", Choice::recompute}});

  at::manual_seed(7);
  remat::collect_trace();
  auto out = remat::checkpoint({.region_name = "planned-dropout", .plan = plan})([&](const at::Tensor& in) {
    auto y = remat::region([&](const at::Tensor& t) { return block.attention(t); }, "attention")(in);
    return remat::region([&](const at::Tensor& t) { return block.mlp(t, 0.3); }, "mlp", false)(y);
  })(x);
  EXPECT_EQ(remat::collect_trace().format(),
            "remat trace: 1 checkpoint(s), 2 region(s)\n"
            "scope [planned-dropout]\n"
            "  attention: recompute\n"
            "  mlp: recompute\n");  // the plan's choice over the code's
  at::rand({3});  // the caller moves the generator on before backward
  out.pow(2).sum().backward();
  const auto actual = gradients(block, x);
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(at::equal(actual[i], expected[i])) << "gradient " << i;
}

// Under a plan the runtime adds, beside the CPU generator's hook, one for the CUDA generators; where
// LibTorch has no CUDA (this program links no CUDA library) it keeps nothing and asks CUDA nothing:
// the CUDA hooks LibTorch stands in with then refuse any generator or context query.
TEST(StateHooks, TheRuntimesCudaGeneratorsHookWithoutCudaKeepsNothingAndLeavesTheCpuGeneratorAlone) {
  ASSERT_FALSE(at::globalContext().hasCUDA());
  const auto hook = remat::detail::cuda_generators_state_hook();
  at::manual_seed(11);
  const at::Tensor before = at::detail::getDefaultCPUGenerator().get_state();
  const std::any state = hook->snapshot();
  at::rand({5});
  const at::Tensor moved = at::detail::getDefaultCPUGenerator().get_state();
  EXPECT_NO_THROW(hook->restore(state));
  EXPECT_TRUE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), moved));  // the CPU one is not its
  EXPECT_FALSE(at::equal(before, moved));
}

TEST(StateHooks, WithoutTheHookDropoutDiverges) {
  const Block block = Block::make();
  auto x = at::randn({2, 6, Block::D}).requires_grad_(true);
  const auto expected = dropout_reference(block, x);
  at::manual_seed(7);
  auto out = remat::checkpoint({.region_name = "dropout-no-hook"})([&](const at::Tensor& in) {
    return remat::region([&](const at::Tensor& t) { return block.mlp(block.attention(t), 0.3); }, "all")(in);
  })(x);
  out.pow(2).sum().backward();
  EXPECT_FALSE(at::equal(gradients(block, x)[8], expected[8]));  // w1 sees a different mask
}

// Counts through a shared integer so the test sees every snapshot and restore.
class CounterHook final : public remat::RecomputeStateHook {
 public:
  explicit CounterHook(int& counter, std::vector<std::string>& events) : counter_(counter), events_(events) {}
  std::any snapshot() override {
    events_.push_back("snapshot " + std::to_string(counter_));
    return counter_;
  }
  void restore(const std::any& state) override {
    counter_ = std::any_cast<int>(state);
    events_.push_back("restore " + std::to_string(counter_));
  }

 private:
  int& counter_;
  std::vector<std::string>& events_;
};

TEST(StateHooks, SnapshotAtEntryAndAfterSaveRegionsRestoredInRecomputeThenOuterStateBack) {
  int counter = 0;
  std::vector<std::string> events;
  std::vector<int> seen_in_recompute;
  auto hook = std::make_shared<CounterHook>(counter, events);
  auto x = at::rand({4}).requires_grad_(true);
  auto out = remat::checkpoint({.region_name = "hooks", .recompute_state_hooks = {hook}})([&](const at::Tensor& in) {
    counter += 1;  // 1
    auto a = remat::region([&](const at::Tensor& t) { counter += 10; return t * 2.0; }, "saved", false)(in);
    if (remat::is_recomputing()) seen_in_recompute.push_back(counter);
    counter += 100;
    return remat::region([&](const at::Tensor& t) { return t.exp().sum(); }, "recomputed")(a);
  })(x);
  EXPECT_EQ(counter, 111);
  counter = 5000;  // state at recompute time, which recompute must leave as it found it
  out.backward();
  EXPECT_EQ(counter, 5000);
  EXPECT_EQ(seen_in_recompute, (std::vector<int>{11}));  // restored to the state after "saved"
  EXPECT_EQ(events, (std::vector<std::string>{"snapshot 0", "snapshot 11", "snapshot 5000", "restore 0", "restore 11",
                                              "restore 5000"}));
}

TEST(Leaks, LiveBytesReturnToBaselineAfterBackward) {
  const Block block = Block::make();
  auto x = at::randn({2, 6, Block::D}).requires_grad_(true);
  for (int i = 0; i < 3; ++i) {
    auto out = remat::checkpoint({.region_name = "leak"})([&](const at::Tensor& in) {
      auto y = remat::region([&](const at::Tensor& t) { return block.attention(t); }, "attention", false)(in);
      return remat::region([&](const at::Tensor& t) { return block.mlp(t); }, "mlp")(y);
    })(x);
    EXPECT_GT(remat::live_bytes("leak"), 0);
    out.sum().backward();
    out = at::Tensor();
    EXPECT_EQ(remat::live_bytes("leak"), 0) << "iteration " << i;
  }
}

}  // namespace
