// A budget plan's offload decisions carried out by the C++ runtime (CheckpointOptions::plan): a
// region the plan offloads runs saved with the plan's offloader in force, so what it keeps goes to
// the host pool (phase `offloaded`) and comes back for backward. On the CPU the host copies are
// host memory like every tensor, so what stays "on the device" is what the allocator holds outside
// phase `offloaded`, measured as tests/python/remat/test_offload_peak_plans.py measures it: the
// step's requested bytes replayed from the allocator's trace without the blocks in that phase.
// The plan is tests/remat/data/offload_plan.json, a remat-plan dump that
// tests/python/remat/test_plan_offload_runtime.py runs through the Python layer too: the figures
// asserted here are those that test measures there.

#include "support.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/budget/plan.hpp>
#include <remat/cpu_offload.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

namespace alloc = remat::alloc;
namespace budget = remat::budget;

// The model of tests/python/remat/test_offload_plans.py: 3 layers of two regions over 32 x 128.
constexpr std::int64_t kWidth = 128;
constexpr std::int64_t kRows = 32;
constexpr int kLayers = 3;

struct Model {
  std::vector<at::Tensor> weights;  // two per layer
  at::Tensor x;
};

Model make_model() {
  Model model;
  auto weights = at::make_generator<at::CPUGeneratorImpl>(7);
  for (int i = 0; i < 2 * kLayers; ++i)
    model.weights.push_back((at::randn({kWidth, kWidth}, weights) / 8).requires_grad_());
  auto rows = at::make_generator<at::CPUGeneratorImpl>(3);
  model.x = at::randn({kRows, kWidth}, rows).requires_grad_();
  return model;
}

at::Tensor block(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2) {
  at::Tensor h = remat::region([&](const at::Tensor& t) { return at::tanh(at::matmul(t, w1)); }, "attn")(x);
  return remat::region([&](const at::Tensor& t) { return (at::sigmoid(at::matmul(t, w2)) * t).sin(); }, "mlp")(h);
}

// The loss, each layer checkpointed under `plan`; without a plan, no checkpoint at all.
at::Tensor loss(const Model& model, const std::shared_ptr<const budget::RegionChoices>& plan) {
  at::Tensor h = model.x;
  for (int layer = 0; layer < kLayers; ++layer) {
    const at::Tensor& w1 = model.weights[2 * layer];
    const at::Tensor& w2 = model.weights[2 * layer + 1];
    if (!plan) {
      h = block(h, w1, w2);
      continue;
    }
    h = remat::checkpoint({.region_name = "layers." + std::to_string(layer), .plan = plan})(
        [](const at::Tensor& t, const at::Tensor& a, const at::Tensor& b) { return block(t, a, b); })(h, w1, w2);
  }
  return h.square().sum();
}

// The loss's gradients for the input and the weights, as torch.autograd.grad gives them (the
// Python test takes them so: the same allocations).
std::vector<at::Tensor> gradients_of(const at::Tensor& l, const Model& model) {
  std::vector<at::Tensor> leaves{model.x};
  leaves.insert(leaves.end(), model.weights.begin(), model.weights.end());
  return torch::autograd::grad({l}, leaves);
}

budget::Plan fixture_plan() {
  const char* path = REMAT_RUNTIME_TEST_DATA "/offload_plan.json";
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return budget::plan_from_json(text.str(), path);
}

// The peak the fixture plan's profile predicted for it (profile.predict_peak(plan) when the fixture
// was made).
constexpr std::int64_t kPredictedPeak = 901128;

bool on_host(alloc::TagId tag) { return alloc::tag_of(tag).phase == alloc::Phase::offloaded; }

// Requested bytes live now in the host pool outside phase `offloaded` and in it.
std::pair<std::int64_t, std::int64_t> live_device_and_host_bytes() {
  std::int64_t device = 0;
  std::int64_t host = 0;
  for (const alloc::TagStatsEntry& entry : alloc::pinned_host_allocator().tag_stats()) {
    (on_host(entry.tag) ? host : device) += entry.stats.requested_bytes.current;
  }
  return {device, host};
}

// The most requested bytes outside phase `offloaded` held at once while `step` runs, replayed from
// the allocator's trace (test_offload_peak_plans.py's device_peak).
template <typename Step>
std::int64_t device_peak(Step&& step) {
  static bool toggle = false;
  toggle = !toggle;
  alloc::configure(std::string("trace_entries:") + std::to_string((1 << 18) + (toggle ? 1 : 0)));  // an empty trace
  alloc::CachingAllocator& pool = alloc::pinned_host_allocator();
  std::unordered_map<std::uint64_t, std::pair<std::int64_t, alloc::TagId>> live;
  std::int64_t current = 0;
  for (const alloc::SegmentInfo& segment : pool.snapshot().segments) {
    for (const alloc::BlockInfo& b : segment.blocks) {
      if (b.state != alloc::BlockState::active_allocated) continue;
      live[b.address] = {static_cast<std::int64_t>(b.requested_size), b.tag};
      current += on_host(b.tag) ? 0 : static_cast<std::int64_t>(b.requested_size);
    }
  }
  std::int64_t peak = current;
  step();
  const alloc::AllocatorSnapshot after = pool.snapshot();
  EXPECT_EQ(after.trace_dropped, 0U);
  for (const alloc::TraceEvent& event : after.trace) {
    if (event.action == alloc::TraceAction::alloc) {
      live[event.address] = {static_cast<std::int64_t>(event.requested), event.tag};
      current += on_host(event.tag) ? 0 : static_cast<std::int64_t>(event.requested);
    } else if (event.action == alloc::TraceAction::free_requested) {
      const auto [requested, tag] = live.at(event.address);
      live.erase(event.address);
      current -= on_host(tag) ? 0 : requested;
    } else if (event.action == alloc::TraceAction::retag) {
      auto& [requested, tag] = live.at(event.address);
      current += requested * (static_cast<int>(!on_host(event.tag)) - static_cast<int>(!on_host(tag)));
      tag = event.tag;
    }
    peak = std::max(peak, current);
  }
  return peak;
}

TEST(PlanOffload, APlansOffloadedRegionsGoToTheHostWithGradientsBitwiseThoseWithoutCheckpointing) {
  const budget::Plan dump = fixture_plan();
  ASSERT_TRUE(dump.host_budget_bytes.has_value());
  const auto plan = std::make_shared<const budget::RegionChoices>(dump);
  const std::vector<std::string> offloaded{"layers.0::attn", "layers.0::mlp", "layers.1::attn"};
  for (std::size_t r = 0; r < dump.regions.size(); ++r) {
    const std::string& name = dump.regions[r].first.name;
    EXPECT_EQ(plan->offloads(name), std::find(offloaded.begin(), offloaded.end(), name) != offloaded.end()) << name;
  }
  const Model model = make_model();
  const std::vector<at::Tensor> expected = gradients_of(loss(model, nullptr), model);
  std::int64_t held = 0;  // the reference gradients
  for (const at::Tensor& g : expected) held += static_cast<std::int64_t>(g.nbytes());
  std::int64_t before_step = static_cast<std::int64_t>(model.x.nbytes());  // the input and the weights
  for (const at::Tensor& w : model.weights) before_step += static_cast<std::int64_t>(w.nbytes());

  const std::shared_ptr<remat::CpuOffload> offloader = remat::plan_offloader(plan);
  ASSERT_NE(offloader, nullptr);
  EXPECT_EQ(remat::plan_offloader(plan), offloader);  // one per plan, across steps
  for (int step = 0; step < 3; ++step) {              // the host pool serves step after step
    const auto [device_before, host_before] = live_device_and_host_bytes();
    EXPECT_EQ(host_before, 0);
    std::int64_t device_kept = 0;
    std::int64_t host_kept = 0;
    std::vector<at::Tensor> actual;
    const std::int64_t peak = device_peak([&] {
      at::Tensor l = loss(model, plan);
      const auto [device_after, host_after] = live_device_and_host_bytes();
      device_kept = device_after - device_before;
      host_kept = host_after;
      actual = gradients_of(l, model);
    });
    // What the Python layer moves for the same plan (test_plan_offload_runtime.py): 5 tensors of
    // 32 x 128 floats, each once, within the plan's host bytes.
    EXPECT_EQ(host_kept, 5 * remat::testing::float_bytes(kRows * kWidth));
    EXPECT_EQ(static_cast<std::uint64_t>(host_kept), offloader->stats().offloaded_bytes);
    EXPECT_LE(static_cast<std::uint64_t>(host_kept), dump.host_bytes);
    EXPECT_LE(dump.host_bytes, *dump.host_budget_bytes);
    // On the device after forward: the saved region's output (layers.2::attn) and the input its
    // matmul saves (layer 1's output), the last layer's output (saved by square) and the loss.
    // The plan's kept bytes count the first two, and the inputs and weights that live before the
    // step; so within them beside the last two.
    EXPECT_EQ(device_kept, 3 * remat::testing::float_bytes(kRows * kWidth) + remat::testing::float_bytes(1));
    EXPECT_LE(device_kept, static_cast<std::int64_t>(dump.kept_bytes) - before_step +
                               remat::testing::float_bytes(kRows * kWidth + 1));
    // At the step's peak, beside the reference gradients held here, within the peak the profile
    // predicted for the plan.
    EXPECT_LE(peak - held, kPredictedPeak);
    EXPECT_EQ(offloader->stats().resident_host_bytes, 0U);
    EXPECT_EQ(live_device_and_host_bytes().second, 0);
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(at::equal(actual[i], expected[i])) << "gradient " << i;
    std::printf(
        "step %d: device peak %lld (%lld beside the gradients held; predicted %lld), kept on device %lld, "
        "on host %lld\n",
        step, static_cast<long long>(peak), static_cast<long long>(peak - held), static_cast<long long>(kPredictedPeak),
        static_cast<long long>(device_kept), static_cast<long long>(host_kept));
  }
}

TEST(PlanOffload, APlanThatOffloadsNothingHasNoOffloader) {
  using budget::Choice;
  const auto plan = std::make_shared<const budget::RegionChoices>(
      std::vector<std::pair<std::string, Choice>>{{"layers.0::attn", Choice::save}});
  EXPECT_EQ(remat::plan_offloader(plan), nullptr);
  EXPECT_EQ(remat::plan_offloader(nullptr), nullptr);
}

// A plan outlives none of its offloader's payloads' needs: a plan let go of after forward still
// brings its tensors back in backward.
TEST(PlanOffload, BackwardAfterThePlanIsGoneStillFindsTheOffloadedTensors) {
  const Model model = make_model();
  const std::vector<at::Tensor> expected = gradients_of(loss(model, nullptr), model);
  auto plan = std::make_shared<const budget::RegionChoices>(fixture_plan());
  at::Tensor l = loss(model, plan);
  EXPECT_GT(live_device_and_host_bytes().second, 0);
  plan.reset();
  const std::vector<at::Tensor> actual = gradients_of(l, model);
  l = at::Tensor();
  EXPECT_EQ(live_device_and_host_bytes().second, 0);
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(at::equal(actual[i], expected[i])) << "gradient " << i;
}

}  // namespace
