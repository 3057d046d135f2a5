// Under a plan, a save region whose skip in recompute would lose or repeat an in-place change (it
// changed its input in place, or its output was changed in place after it returned) runs again
// in recompute: gradients stay bitwise those without checkpointing, dropout inside it included,
// and the memory report says which regions run again and why; a region whose kept output is
// changed after the checkpoint returned runs again too. Without a plan (the code's own choice)
// such a region stays refused, as does a change to a tensor recompute does not make.

#include "support.hpp"

#include <remat/budget/plan.hpp>

#include <algorithm>
#include <map>

namespace {

using remat::budget::Choice;

constexpr std::int64_t D = 16;

struct Weights {
  at::Tensor w1 = at::randn({D, D}).requires_grad_(true);
  at::Tensor w2 = at::randn({D, D}).requires_grad_(true);
  std::vector<at::Tensor> grads(const at::Tensor& x) const {
    return {w1.grad().clone(), w2.grad().clone(), x.grad().clone()};
  }
  void zero(const at::Tensor& x) const {
    for (const at::Tensor& t : {w1, w2, x}) t.mutable_grad() = at::Tensor();
  }
};

// lin (matmul) -> act (ReLU in place on its input, then dropout) -> out (matmul, plus lin's
// output as act left it). With `add_in_place`, code after lin adds the checkpoint's input into
// lin's output in place instead (h += x), and act only draws dropout.
struct Layer {
  const Weights& weights;
  bool add_in_place = false;
  std::map<std::string, int> runs;

  at::Tensor operator()(const at::Tensor& x) {
    auto h = remat::region(
        [this](const at::Tensor& t) {
          ++runs["lin"];
          return at::matmul(t, weights.w1);
        },
        "lin")(x);
    if (add_in_place) h.add_(x);
    auto a = remat::region(
        [this](const at::Tensor& t) {
          ++runs["act"];
          if (!add_in_place) t.relu_();
          return at::dropout(t, 0.3, /*train=*/true);
        },
        "act")(h);
    return remat::region([this, h](const at::Tensor& t) { return at::matmul(t, weights.w2) + h; }, "out")(a);
  }
};

std::shared_ptr<remat::budget::RegionChoices> plan_saving(const std::string& checkpoint,
                                                          const std::vector<std::string>& saved) {
  std::vector<std::pair<std::string, Choice>> choices;
  for (const char* region : {"lin", "act", "out"}) {
    const bool save = std::find(saved.begin(), saved.end(), region) != saved.end();
    choices.emplace_back(checkpoint + "::" + region, save ? Choice::save : Choice::recompute);
  }
  return std::make_shared<remat::budget::RegionChoices>(std::move(choices));
}

struct RerunCase {
  bool add_in_place;
  std::vector<std::string> saved;
  std::string rerun;   // the region that runs again
  std::string reason;  // a part of why
};

class RerunSaveRegion : public ::testing::TestWithParam<RerunCase> {};

TEST_P(RerunSaveRegion, GradientsAreBitwiseThoseWithoutCheckpointingDropoutIncluded) {
  const RerunCase c = GetParam();
  at::manual_seed(0);
  const Weights weights;
  auto x = at::randn({4, D}).requires_grad_(true);
  Layer plain{weights, c.add_in_place, {}};
  at::manual_seed(7);
  plain(x * 1.0).pow(2).sum().backward();
  const auto expected = weights.grads(x);
  weights.zero(x);

  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  Layer layer{weights, c.add_in_place, {}};
  at::manual_seed(7);
  // x * 1.0: the checkpoint's input is made before it; changing it in place would be refused.
  auto out = remat::checkpoint({.region_name = name, .plan = plan_saving(name, c.saved)})(
      [&](const at::Tensor& in) { return layer(in); })(x * 1.0);
  const auto reports = remat::live_checkpoint_reports();
  ASSERT_EQ(reports.size(), 1u);
  ASSERT_EQ(reports[0].rerun_regions.size(), 1u);
  EXPECT_EQ(reports[0].rerun_regions[0].region, name + "::" + c.rerun);
  EXPECT_NE(reports[0].rerun_regions[0].reason.find(c.reason), std::string::npos) << reports[0].rerun_regions[0].reason;
  at::rand({3});  // the caller moves the generator on before backward
  out.pow(2).sum().backward();
  EXPECT_EQ(layer.runs[c.rerun], 2);  // forward, then recompute ran it again though the plan saves it
  const auto actual = weights.grads(x);
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(at::equal(actual[i], expected[i])) << "gradient " << i;
}

INSTANTIATE_TEST_SUITE_P(
    InPlaceChanges, RerunSaveRegion,
    ::testing::Values(RerunCase{false, {"act"}, "act", "it changes its input 0 in place"},
                      RerunCase{true, {"lin"}, "lin", "its output 0 is changed in place after it returns"}),
    [](const auto& param_info) {
      return std::string(param_info.param.add_in_place ? "OutputChangedAfter" : "InputChangedInside");
    });

// lin (recompute) -> out (save: a matmul, then dropout), whose output, kept for recompute, is the
// checkpoint's output, which the caller changes in place (h = checkpoint(layer)(h); h.mul_(1.5)).
struct KeptOutputChangedAfter {
  const Weights& weights;
  int out_runs = 0;

  at::Tensor operator()(const at::Tensor& x) {
    auto h = remat::region([this](const at::Tensor& t) { return at::matmul(t, weights.w1); }, "lin")(x);
    auto y = remat::region(
        [this](const at::Tensor& t) {
          ++out_runs;
          return at::dropout(at::matmul(t, weights.w2), 0.3, /*train=*/true);
        },
        "out", /*recompute=*/false)(h);
    remat::recompute_needs_tensor(y);  // as the Python layer keeps a planned save region's outputs
    return y;
  }
};

at::Tensor run_changed_after(KeptOutputChangedAfter& layer, const at::Tensor& x,
                             std::shared_ptr<remat::budget::RegionChoices> plan) {
  at::manual_seed(7);
  auto out = remat::checkpoint({.region_name = "changed_after", .plan = std::move(plan)})(
      [&](const at::Tensor& in) { return layer(in); })(x * 1.0);
  out.mul_(1.5);
  at::rand({3});  // the caller moves the generator on before backward
  return out.pow(2).sum();
}

TEST(RerunSaveRegion, UnderAPlanASaveRegionWhoseKeptOutputIsChangedAfterTheCheckpointRunsAgain) {
  at::manual_seed(0);
  const Weights weights;
  auto x = at::randn({4, D}).requires_grad_(true);
  at::manual_seed(7);
  auto plain = at::dropout(at::matmul(at::matmul(x * 1.0, weights.w1), weights.w2), 0.3, /*train=*/true);
  plain.mul_(1.5);
  plain.pow(2).sum().backward();
  const auto expected = weights.grads(x);
  weights.zero(x);

  KeptOutputChangedAfter layer{weights};
  run_changed_after(layer, x, plan_saving("changed_after", {"out"})).backward();  // the code's own choices
  EXPECT_EQ(layer.out_runs, 2);  // forward, then recompute, which remade the output as forward made it
  const auto actual = weights.grads(x);
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(at::equal(actual[i], expected[i])) << "gradient " << i;
}

TEST(RerunSaveRegion, WithoutAPlanAKeptOutputChangedAfterTheCheckpointIsStillRefused) {
  const Weights weights;
  auto x = at::randn({4, D}).requires_grad_(true);
  KeptOutputChangedAfter layer{weights};
  auto loss = run_changed_after(layer, x, nullptr);
  try {
    loss.backward();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("output 0 of save region 'changed_after::out' was changed in place after "
                                         "forward"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(layer.out_runs, 1);
}

TEST(RerunSaveRegion, WithoutAPlanTheCodesOwnSaveRegionChangingItsInputIsStillRefused) {
  auto x = at::randn({4, D}).requires_grad_(true);
  try {
    remat::checkpoint({.region_name = "own"})([](const at::Tensor& in) {
      auto h = in * 2.0;
      return remat::region([](const at::Tensor& t) -> at::Tensor { return t.relu_(); }, "act", /*recompute=*/false)(h);
    })(x);
    FAIL() << "expected an error";
  } catch (const remat::Error& e) {
    EXPECT_NE(std::string(e.what()).find("save region 'own::act' changed its input 0 in place"), std::string::npos)
        << e.what();
  }
}

TEST(RerunSaveRegion, UnderAPlanAChangeToATensorMadeBeforeTheCheckpointIsRefused) {
  auto buffer = at::randn({4, D});  // a buffer the body captures: recompute does not make it again
  auto x = at::randn({4, D}).requires_grad_(true);
  const auto plan = std::make_shared<remat::budget::RegionChoices>(
      std::vector<std::pair<std::string, Choice>>{{"captured::act", Choice::save}});
  try {
    remat::checkpoint({.region_name = "captured", .plan = plan})([&](const at::Tensor& in) {
      auto scaled = remat::region([](const at::Tensor& t) -> at::Tensor { return t.relu_(); }, "act")(buffer);
      return in * scaled;
    })(x);
    FAIL() << "expected an error";
  } catch (const remat::Error& e) {
    EXPECT_NE(std::string(e.what()).find("region 'captured::act' changed its input 0 in place (an op such as "
                                         "x.relu_()), a tensor made before the checkpoint ran or without gradients"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
