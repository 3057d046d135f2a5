// remat::CpuOffload from C++ on the CPU (the same path as on CUDA, copies synchronous): exact
// gradients, what stays resident and why, prefetch by checkpoint, nothing left after backward,
// and the pack info an offloader reads (the checkpoint, the region of a deferred pack).

#include "support.hpp"

#include <remat/cpu_offload.hpp>

#include <set>
#include <string>
#include <vector>

namespace {

constexpr int kLayers = 4;

// A save region that multiplies by a parameter (saved for backward: kept where it is) and
// saves its input, then a recompute region reading the save region's output.
at::Tensor block(const at::Tensor& x, const at::Tensor& weight) {
  at::Tensor h = remat::region([&](const at::Tensor& t) { return (t * weight).sin(); }, "attention",
                               /*recompute=*/false)(x);
  return remat::region([](const at::Tensor& t) { return (t * 3.0).cos(); }, "mlp")(h);
}

// The input's and weight's gradients through kLayers checkpoints, offloaded through `hooks`.
std::vector<at::Tensor> gradients(const std::shared_ptr<remat::SavedTensorHooks>& hooks) {
  auto x = at::linspace(-1.0, 1.0, 64).reshape({8, 8}).requires_grad_(true);
  auto weight = at::linspace(0.5, 1.5, 8).requires_grad_(true);
  at::Tensor h = x * 1.0;
  for (int i = 0; i < kLayers; ++i) {
    h = remat::checkpoint({.region_name = "layers." + std::to_string(i), .saved_tensor_hooks = hooks})(
        [&](const at::Tensor& t) { return block(t, weight); })(h);
  }
  h.sum().backward();
  return {x.grad(), weight.grad()};
}

TEST(CpuOffload, GradientsAreExactAndTheParameterStaysWhereItIs) {
  const std::vector<at::Tensor> expected = gradients(nullptr);
  auto offload = std::make_shared<remat::CpuOffload>(remat::CpuOffloadOptions{.prefetch = 1, .min_bytes = 0});
  const std::vector<at::Tensor> actual = gradients(offload);
  EXPECT_TRUE(at::equal(expected[0], actual[0]));
  EXPECT_TRUE(at::equal(expected[1], actual[1]));
  const remat::CpuOffloadStats stats = offload->stats();
  // Each layer: the region's input (saved by the product), the product (saved by sin) and the
  // region's output (read by recompute).
  EXPECT_EQ(stats.offloaded_tensors, 3u * kLayers);
  EXPECT_EQ(stats.kept_resident_reasons.at("a parameter or a view of one"), static_cast<std::uint64_t>(kLayers));
  EXPECT_EQ(stats.resident_host_bytes, 0u);
  EXPECT_EQ(stats.peak_host_bytes, stats.offloaded_bytes);
  EXPECT_EQ(stats.prefetch_hits + stats.prefetch_misses, stats.offloaded_tensors);
  EXPECT_EQ(stats.prefetch_misses, 1u);  // only the last checkpoint's first tensor, copied on the spot
}

TEST(CpuOffload, WithoutPrefetchEachCheckpointsFirstTensorIsCopiedOnTheSpot) {
  auto offload = std::make_shared<remat::CpuOffload>(remat::CpuOffloadOptions{.prefetch = 0, .min_bytes = 0});
  gradients(offload);
  EXPECT_EQ(offload->stats().prefetch_misses, static_cast<std::uint64_t>(kLayers));
}

// Logs what a pack is told, holding tensors as they are.
class InfoLog final : public remat::SavedTensorHooks {
 public:
  std::any pack(const at::Tensor& tensor) override {
    const remat::SavedTensorInfo& info = remat::current_saved_tensor_info();
    checkpoints.insert(info.checkpoint);
    parameters += info.of_parameter ? 1 : 0;
    if (info.kind == remat::SavedTensorKind::save_output) regions.emplace_back(info.region);
    return tensor;
  }
  at::Tensor unpack(const std::any& payload) override { return std::any_cast<const at::Tensor&>(payload); }

  std::set<const void*> checkpoints;
  int parameters = 0;
  std::vector<std::string> regions;
};

TEST(CpuOffload, APackIsToldItsCheckpointWhetherItIsAParameterAndTheRegionOfADeferredPack) {
  auto log = std::make_shared<InfoLog>();
  gradients(log);
  EXPECT_EQ(log->checkpoints.size(), static_cast<std::size_t>(kLayers));
  EXPECT_FALSE(log->checkpoints.count(nullptr));
  EXPECT_EQ(log->parameters, kLayers);
  EXPECT_EQ(log->regions, (std::vector<std::string>{"layers.0::attention", "layers.1::attention",
                                                     "layers.2::attention", "layers.3::attention"}));
}

}  // namespace
