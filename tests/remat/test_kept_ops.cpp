// A per-op plan carried out by the C++ runtime (CheckpointOptions::plan made from a plan with
// kept_ops): a recomputed region keeping an op's outputs holds them from forward, and recompute
// hands them back instead of running the op again, with gradients bitwise those of no
// checkpointing, also beside a region the same plan offloads. A region whose ops differ from the
// plan's, or whose recompute differs from its forward, is refused naming the first difference.

#include "support.hpp"

#include <remat/budget/error.hpp>
#include <remat/budget/plan.hpp>
#include <remat/cpu_offload.hpp>
#include <remat/kept_ops.hpp>
#include <remat/replay.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace budget = remat::budget;
using remat::testing::float_bytes;

constexpr std::int64_t kRows = 16;
constexpr std::int64_t kWidth = 32;

// The region's matmul output in forward, then in recompute: held here, so that a matmul run
// again in recompute cannot reuse forward's memory.
struct Seen {
  std::vector<at::Tensor> outputs;
  const void* forward() const { return outputs.empty() ? nullptr : outputs[0].data_ptr(); }
  const void* recompute() const { return outputs.size() < 2 ? nullptr : outputs[1].data_ptr(); }
};

// The region "mlp" runs aten::mm (op 0), aten::sigmoid (1), aten::mul.Tensor (2), aten::sin (3);
// `between` runs after the matmul, on its output.
using Between = std::function<void(at::Tensor&)>;

at::Tensor mlp(const at::Tensor& x, const at::Tensor& w, Seen& seen, const Between& between) {
  at::Tensor h = at::mm(x, w);
  seen.outputs.push_back(h);
  if (between) between(h);
  return (at::sigmoid(h) * x).sin();
}

struct Inputs {
  at::Tensor x;
  at::Tensor w;
};

Inputs inputs() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  return {at::randn({kRows, kWidth}, generator).requires_grad_(),
          (at::randn({kWidth, kWidth}, generator) / 8).requires_grad_()};
}

// A plan that recomputes layer::mlp keeping `ops` (none: a plan by regions).
std::shared_ptr<const budget::RegionChoices> plan_keeping(std::vector<budget::OpCost> ops,
                                                          budget::Choice choice = budget::Choice::recompute) {
  budget::Plan plan;
  budget::RegionCost region;
  region.name = "layer::mlp";
  plan.regions.emplace_back(region, choice);
  if (!ops.empty()) plan.kept_ops.push_back(std::move(ops));
  return std::make_shared<budget::RegionChoices>(plan);
}

std::vector<budget::OpCost> the_matmul() {
  return {budget::OpCost{0, "aten::mm", static_cast<std::uint64_t>(float_bytes(kRows * kWidth)), 0}};
}

// The gradients of x and w; checkpointed as layer::mlp under `plan`, or without a checkpoint.
std::vector<at::Tensor> gradients(const std::shared_ptr<const budget::RegionChoices>& plan, Seen& seen,
                                  const Between& between = {}) {
  const Inputs in = inputs();
  auto body = [&](const at::Tensor& x, const at::Tensor& w) {
    return remat::region([&](const at::Tensor& t) { return mlp(t, w, seen, between); }, "mlp")(x);
  };
  at::Tensor y = plan ? remat::checkpoint({.region_name = "layer", .plan = plan})(body)(in.x, in.w) : body(in.x, in.w);
  return torch::autograd::grad({y.square().sum()}, {in.x, in.w});
}

void expect_bitwise(const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(at::equal(actual[i], expected[i])) << "gradient " << i;
}

TEST(KeptOps, RecomputeTakesTheKeptMatmulInsteadOfRunningItAgain) {
  Seen plain;
  const auto expected = gradients(nullptr, plain);

  Seen kept;
  expect_bitwise(gradients(plan_keeping(the_matmul()), kept), expected);
  EXPECT_EQ(kept.recompute(), kept.forward()) << "recompute handed back forward's matmul output";

  Seen by_regions;  // the same region recomputed without kept ops: the matmul runs again
  expect_bitwise(gradients(plan_keeping({}), by_regions), expected);
  ASSERT_NE(by_regions.recompute(), nullptr);
  EXPECT_NE(by_regions.recompute(), by_regions.forward());
}

TEST(KeptOps, TheKeptOutputIsHeldFromForwardUntilRecomputeTakesIt) {
  const Inputs in = inputs();
  Seen seen;
  auto body = [&](const at::Tensor& x, const at::Tensor& w) {
    return remat::region([&](const at::Tensor& t) { return mlp(t, w, seen, {}); }, "mlp")(x);
  };
  const auto plan = plan_keeping(the_matmul());
  at::Tensor loss = remat::checkpoint({.region_name = "layer", .plan = plan})(body)(in.x, in.w).square().sum();
  const auto held = remat::held_op_outputs();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].bytes, static_cast<std::uint64_t>(float_bytes(kRows * kWidth)));
  EXPECT_EQ(held[0].address, reinterpret_cast<std::uintptr_t>(seen.forward()));
  EXPECT_EQ(held[0].device, "cpu");
  loss.backward();
  EXPECT_TRUE(remat::held_op_outputs().empty());

  // A checkpoint dropped before its backward lets them go with it (its graph, which the matmul's
  // output seen here is part of, holds the checkpoint call).
  loss = remat::checkpoint({.region_name = "layer", .plan = plan})(body)(in.x, in.w).square().sum();
  EXPECT_EQ(remat::held_op_outputs().size(), 1u);
  seen.outputs.clear();
  loss = at::Tensor();
  EXPECT_TRUE(remat::held_op_outputs().empty());
}

// A plan made by solve_ops_offload: one region offloaded, the next recomputed keeping its matmul.
TEST(KeptOps, OnePlanOffloadsOneRegionAndKeepsAnOpOfAnother) {
  budget::Plan dump;
  budget::RegionCost attn, mlp_region;
  attn.name = "layer::attn";
  mlp_region.name = "layer::mlp";
  dump.regions = {{attn, budget::Choice::save}, {mlp_region, budget::Choice::recompute}};
  dump.kept_ops = {{}, the_matmul()};
  dump.offloaded = {true, false};
  dump.host_budget_bytes = std::uint64_t{1} << 20;
  const auto plan = std::make_shared<const budget::RegionChoices>(dump);
  const auto loss = [&](bool checkpointed, Seen& seen) {
    const Inputs in = inputs();
    auto body = [&](const at::Tensor& x, const at::Tensor& w) {
      const at::Tensor h = remat::region([&](const at::Tensor& t) { return at::tanh(at::mm(t, w)); }, "attn")(x);
      return remat::region([&](const at::Tensor& t) { return mlp(t, w, seen, {}); }, "mlp")(h);
    };
    at::Tensor y =
        checkpointed ? remat::checkpoint({.region_name = "layer", .plan = plan})(body)(in.x, in.w) : body(in.x, in.w);
    return torch::autograd::grad({y.square().sum()}, {in.x, in.w});
  };
  Seen plain, kept;
  const auto expected = loss(false, plain);
  expect_bitwise(loss(true, kept), expected);
  EXPECT_EQ(kept.recompute(), kept.forward()) << "recompute handed back forward's matmul output";
  const std::shared_ptr<remat::CpuOffload> offloader = remat::plan_offloader(plan);
  ASSERT_NE(offloader, nullptr);
  // attn's tanh output (its backward reads it) went to the host and came back.
  EXPECT_GE(offloader->stats().offloaded_bytes, static_cast<std::uint64_t>(float_bytes(kRows * kWidth)));
  EXPECT_EQ(offloader->stats().resident_host_bytes, 0u);
  EXPECT_TRUE(remat::held_op_outputs().empty());
}

TEST(KeptOps, AKeptOutputWrittenInPlaceAfterwardsIsComputedAgain) {
  Seen plain;
  const Between scale = [](at::Tensor& h) { h.mul_(0.5); };
  const auto expected = gradients(nullptr, plain, scale);
  Seen kept;
  expect_bitwise(gradients(plan_keeping(the_matmul()), kept, scale), expected);
  ASSERT_NE(kept.recompute(), nullptr);
  EXPECT_NE(kept.recompute(), kept.forward()) << "the changed output was handed back";
}

std::string value_error(const std::function<void()>& run) {
  try {
    run();
  } catch (const c10::ValueError& error) {
    return error.what_without_backtrace();
  }
  return "(no error)";
}

TEST(KeptOps, ARegionWhoseOpsDifferFromThePlansIsRefusedNamingTheFirstDifference) {
  Seen seen;
  const std::string other = value_error([&] {
    gradients(plan_keeping({budget::OpCost{1, "aten::tanh", 0, 0}}), seen);
  });
  EXPECT_NE(other.find("region 'layer::mlp': op 1 is aten::sigmoid, but the plan keeps aten::tanh there"),
            std::string::npos)
      << other;
  const std::string fewer = value_error([&] { gradients(plan_keeping({budget::OpCost{9, "aten::cos", 0, 0}}), seen); });
  EXPECT_NE(fewer.find("region 'layer::mlp' ran 4 ops, but the plan keeps op 9 (aten::cos)"), std::string::npos)
      << fewer;
  EXPECT_TRUE(remat::held_op_outputs().empty());
}

TEST(KeptOps, RecomputeTakingAnotherPathIsRefused) {
  Seen seen;
  const Between branch = [](at::Tensor& h) {
    if (remat::is_recomputing()) h = at::cos(h);
  };
  const std::string error = value_error([&] { gradients(plan_keeping(the_matmul()), seen, branch); });
  EXPECT_NE(error.find("region 'layer::mlp': recompute ran aten::cos as op 1, where forward ran aten::sigmoid"),
            std::string::npos)
      << error;
}

TEST(KeptOps, ARegionRecordingAReplayDecisionKeepsNoOp) {
  remat::RecomputeReplay<int> channel("decisions");
  const Inputs in = inputs();
  Seen seen;
  auto body = [&](const at::Tensor& x, const at::Tensor& w) {
    return remat::region(
        [&](const at::Tensor& t) {
          channel.record_or_replay([] { return 1; });
          return mlp(t, w, seen, {});
        },
        "mlp")(x);
  };
  const std::string error = value_error([&] {
    remat::checkpoint(
        {.region_name = "layer", .contexts = {channel.context_factory()}, .plan = plan_keeping(the_matmul())})(body)(
        in.x, in.w);
  });
  EXPECT_NE(error.find("region 'layer::mlp' records a decision on a RecomputeReplay channel"), std::string::npos)
      << error;
  EXPECT_TRUE(remat::held_op_outputs().empty());
}

TEST(KeptOps, APlanKeepingOpsOfASavedRegionIsRefused) {
  try {
    plan_keeping(the_matmul(), budget::Choice::save);
    FAIL() << "a saved region keeping ops was accepted";
  } catch (const budget::BudgetError& error) {
    EXPECT_NE(std::string(error.what()).find("keeps ops of 'layer::mlp', which it saves"), std::string::npos)
        << error.what();
  }
}

}  // namespace

namespace {

bool key_included() { return c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake); }

TEST(KeptOps, ScopesClosedOutOfOrderLeaveTheOpenOnesWorking) {
  remat::KeptOps first("a::r", {{0, "aten::mm"}});
  remat::KeptOps second("b::r", {{0, "aten::mm"}});
  const at::Tensor x = at::ones({2, 2});
  auto outer = std::make_unique<remat::KeptOps::Scope>(first, /*recomputing=*/false);
  auto inner = std::make_unique<remat::KeptOps::Scope>(second, /*recomputing=*/false);
  outer.reset();  // closed before the scope opened after it
  EXPECT_TRUE(key_included());
  (void)at::mm(x, x);  // still seen by the open scope: its op 0 is held
  inner->finish();
  EXPECT_FALSE(key_included());
  const auto held = remat::held_op_outputs();
  EXPECT_EQ(held.size(), 1u);
  second.clear();
  EXPECT_TRUE(remat::held_op_outputs().empty());
}

}  // namespace
