// The tagging allocator as LibTorch's CUDA allocator, and the checkpoint runtime on CUDA
// tensors, on a real GPU. Exits 77 (skipped) where no GPU is visible.
//
//   remat_cuda_tests                 the suite; installs the allocator before any CUDA use
//   remat_cuda_tests --late-install  exits 0 when installing after LibTorch used its own
//                                    CUDA allocator is refused with a clear error

#include "../../support/cuda_stream_gate.hpp"
#include "../transformer_block.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/cuda_backend.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/cuda_allocator.hpp>
#include <remat/cuda_state_hooks.hpp>
#include <remat/remat.hpp>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

namespace {

using remat::testing::Block;

constexpr std::int64_t kFloats = 1 << 16;
constexpr std::int64_t kBytes = kFloats * 4;

remat::alloc::CachingAllocator& gpu0() { return remat::alloc::device_allocator(0); }

TEST(CudaAllocator, IsInstalledOnceAndAgainIsANoOp) {
  EXPECT_TRUE(remat::cuda_allocator_installed());
  remat::install_cuda_allocator();
  EXPECT_TRUE(remat::cuda_allocator_installed());
  EXPECT_EQ(gpu0().backend().name(), "cuda");
}

TEST(CudaAllocator, CudaTensorsCarryTheTagsInForce) {
  at::Tensor t;
  {
    auto region = remat::alloc::TagScope::region("cuda.tagged");
    t = at::empty({kFloats}, at::kCUDA);
  }
  EXPECT_EQ(remat::live_bytes("cuda.tagged"), kBytes);
  EXPECT_TRUE(gpu0().tag_of_block(t.data_ptr()).has_value());
  t.fill_(2.0);
  EXPECT_EQ(t.sum().item<float>(), 2.0f * kFloats);
  t = at::Tensor();
  EXPECT_EQ(remat::live_bytes("cuda.tagged"), 0);
}

// The residency table of shared/DESIGN.md on CUDA tensors: A -> B -> C where A saves an
// internal p = exp(x) and B an internal q = exp(y); bytes kept per region are counted by
// the allocator's tags and must equal the analytic count exactly.
struct ResidencyCase {
  bool a_saves;
  bool b_saves;
  std::int64_t resident_tensors;
  int a_runs;
  int b_runs;
};

class CudaResidency : public ::testing::TestWithParam<ResidencyCase> {};

TEST_P(CudaResidency, KeptBytesMatchTheTableAndGradientsMatch) {
  const ResidencyCase c = GetParam();
  const std::string name = std::string("cuda.") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::map<std::string, int> runs;
  auto chain = [&](const at::Tensor& in) {
    auto y = remat::region([&](const at::Tensor& t) { ++runs["A"]; return t.exp() * 3.0; }, "A", !c.a_saves)(in);
    auto z = remat::region([&](const at::Tensor& t) { ++runs["B"]; return t.exp() * 3.0; }, "B", !c.b_saves)(y);
    return remat::region([&](const at::Tensor& t) { return (t * 3.0).sum(); }, "C")(z);
  };
  at::manual_seed(0);
  auto w = (at::rand({kFloats}, at::kCUDA) * 0.1).requires_grad_(true);
  at::Tensor loss;
  {
    at::Tensor x;
    {
      auto input = remat::alloc::TagScope::region(name + ".input");
      x = w * 2.0;
    }
    loss = remat::checkpoint({.region_name = name})(chain)(x);
  }
  // C's output, the loss, is live too but is not what the table counts.
  const std::int64_t kept =
      remat::live_bytes(name + ".input") + remat::live_bytes(name + "::A") + remat::live_bytes(name + "::B");
  EXPECT_EQ(kept, c.resident_tensors * kBytes);
  loss.backward();
  EXPECT_EQ(runs["A"], c.a_runs);
  EXPECT_EQ(runs["B"], c.b_runs);

  auto reference = w.detach().clone().requires_grad_(true);
  (((reference * 2.0).exp() * 3.0).exp() * 9.0).sum().backward();
  EXPECT_TRUE(at::allclose(w.grad(), reference.grad(), 1e-5, 1e-6));
  loss = at::Tensor();
  EXPECT_EQ(remat::live_bytes(name), 0);
  EXPECT_EQ(remat::live_bytes(name + ".input"), 0);
}

INSTANTIATE_TEST_SUITE_P(Table, CudaResidency,
                         ::testing::Values(ResidencyCase{true, true, 4, 1, 1}, ResidencyCase{true, false, 2, 1, 2},
                                           ResidencyCase{false, true, 3, 2, 1}, ResidencyCase{false, false, 1, 2, 2}),
                         [](const auto& param_info) {
                           return std::string(param_info.param.a_saves ? "Save" : "Recompute") +
                                  (param_info.param.b_saves ? "Save" : "Recompute");
                         });

// Largest absolute difference between two gradient lists, and whether they are bitwise equal.
struct Difference {
  double max_abs = 0;
  bool bitwise = true;
};

Difference compare(const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& expected) {
  Difference d;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    d.max_abs = std::max(d.max_abs, (actual[i] - expected[i]).abs().max().item<double>());
    d.bitwise = d.bitwise && at::equal(actual[i], expected[i]);
  }
  return d;
}

at::Tensor checkpointed_block(const Block& block, const at::Tensor& x, bool attention_saves, double dropout,
                              const std::string& name) {
  // Recompute calls the body again in backward, after this function has returned: it
  // captures the parameters by value.
  return remat::checkpoint({.region_name = name, .recompute_state_hooks = {remat::cuda_rng_state_hook()}})(
      [&block, attention_saves, dropout](const at::Tensor& in) {
        auto y = remat::region([&](const at::Tensor& t) { return block.attention(t); }, "attention",
                               !attention_saves)(in);
        return remat::region([&](const at::Tensor& t) { return block.mlp(t, dropout); }, "mlp")(y);
      })(x);
}

TEST(CudaParity, TransformerGradientsMatchNoCheckpointingUnderEveryPolicy) {
  const Block block = Block::make(at::kCUDA);
  auto x = at::randn({4, 32, Block::D}).to(at::kCUDA).requires_grad_(true);
  block.mlp(block.attention(x)).pow(2).sum().backward();
  const auto expected = remat::testing::gradients(block, x);
  remat::testing::zero_grads(block, x);
  for (const bool attention_saves : {true, false}) {
    checkpointed_block(block, x, attention_saves, 0.0, "cuda.parity").pow(2).sum().backward();
    const Difference d = compare(remat::testing::gradients(block, x), expected);
    remat::testing::zero_grads(block, x);
    std::printf("[ parity ] attention %s: max |difference| %.3g, bitwise %s\n",
                attention_saves ? "saved" : "recomputed", d.max_abs, d.bitwise ? "equal" : "different");
    EXPECT_LE(d.max_abs, 1e-5);
  }
  // cuBLAS keeps a workspace per thread and stream, allocated at its first matrix product
  // there: recompute's first one on the checkpoint engine's device thread tags it with the
  // region in force. It is LibTorch's, held for the process; release it before counting.
  c10::cuda::device_synchronize();
  at::cuda::clearCublasWorkspaces();
  EXPECT_EQ(remat::live_bytes("cuda.parity"), 0);
}

// The gradients of the block's attention and mlp (dropout 0.3) without checkpointing, drawn from
// seed 7; the block's and x's gradients zeroed after.
std::vector<at::Tensor> dropout_gradients_unchecked(const Block& block, const at::Tensor& x) {
  at::manual_seed(7);
  block.mlp(block.attention(x), 0.3).pow(2).sum().backward();
  auto expected = remat::testing::gradients(block, x);
  remat::testing::zero_grads(block, x);
  return expected;
}

TEST(CudaParity, DropoutReplaysTheSameMaskWithTheCudaRngHook) {
  const Block block = Block::make(at::kCUDA);
  auto x = at::randn({4, 32, Block::D}).to(at::kCUDA).requires_grad_(true);
  const auto expected = dropout_gradients_unchecked(block, x);

  at::manual_seed(7);
  auto out = checkpointed_block(block, x, /*attention_saves=*/true, 0.3, "cuda.dropout");
  at::rand({3}, at::kCUDA);  // the generator moves on before backward
  out.pow(2).sum().backward();
  const Difference d = compare(remat::testing::gradients(block, x), expected);
  std::printf("[ dropout ] max |difference| %.3g, bitwise %s\n", d.max_abs, d.bitwise ? "equal" : "different");
  EXPECT_LE(d.max_abs, 1e-5);
}

// Under a budget plan the runtime keeps the CUDA generators itself (libtorch_cpu's device-generic
// hooks): a plan that recomputes a region the code saves draws forward's dropout mask again, with
// no remat::cuda_rng_state_hook() passed. Without a plan the same recompute draws another mask.
TEST(CudaParity, APlanThatRecomputesASavedDropoutRegionDrawsForwardsMaskWithoutTheCudaHook) {
  using remat::budget::Choice;
  const Block block = Block::make(at::kCUDA);
  auto x = at::randn({4, 32, Block::D}).to(at::kCUDA).requires_grad_(true);
  const auto expected = dropout_gradients_unchecked(block, x);

  const auto body = [&block](const at::Tensor& in) {
    auto y = remat::region([&block](const at::Tensor& t) { return block.attention(t); }, "attention")(in);
    return remat::region([&block](const at::Tensor& t) { return block.mlp(t, 0.3); }, "mlp", false)(y);
  };
  const auto plan = std::make_shared<remat::budget::RegionChoices>(
      std::vector<std::pair<std::string, Choice>>{{"cuda.planned-dropout::mlp", Choice::recompute}});
  at::manual_seed(7);
  auto out = remat::checkpoint({.region_name = "cuda.planned-dropout", .plan = plan})(body)(x);
  at::rand({3}, at::kCUDA);  // the generator moves on before backward
  out.pow(2).sum().backward();
  const Difference planned = compare(remat::testing::gradients(block, x), expected);
  remat::testing::zero_grads(block, x);
  std::printf("[ dropout ] under a plan, no CUDA hook passed: max |difference| %.3g, bitwise %s\n", planned.max_abs,
              planned.bitwise ? "equal" : "different");
  EXPECT_TRUE(planned.bitwise);

  // The control: the code's own recompute of the same region, no plan and no hook, diverges.
  at::manual_seed(7);
  auto unplanned = remat::checkpoint({.region_name = "cuda.unplanned-dropout"})([&block](const at::Tensor& in) {
    return remat::region([&block](const at::Tensor& t) { return block.mlp(block.attention(t), 0.3); }, "all")(in);
  })(x);
  at::rand({3}, at::kCUDA);
  unplanned.pow(2).sum().backward();
  EXPECT_FALSE(compare(remat::testing::gradients(block, x), expected).bitwise);
  remat::testing::zero_grads(block, x);
}

TEST(CudaAllocator, LibTorchsEmptyCacheReachesTheTaggingAllocator) {
  auto t = at::empty({64 << 20}, at::kCUDA);  // 256 MiB
  const std::int64_t reserved = gpu0().stats().reserved_bytes.current;
  std::size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  t = at::Tensor();
  c10::cuda::CUDACachingAllocator::emptyCache();
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_LE(gpu0().stats().reserved_bytes.current, reserved - (std::int64_t{256} << 20));
  EXPECT_GE(free_after, free_before + (std::size_t{256} << 20));
}

TEST(CudaAllocator, OutOfMemoryIsLibTorchsErrorAndTheReportNamesTheLargestHolder) {
  const auto dir = std::filesystem::temp_directory_path() / ("remat-cuda-oom-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  remat::alloc::configure("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0");
  const std::uint64_t ooms = gpu0().stats().num_ooms;
  at::Tensor big, small;
  {
    auto region = remat::alloc::TagScope::region("cuda.oom.big");
    big = at::empty({std::int64_t{256} << 20}, at::kCUDA);  // 1 GiB
  }
  {
    auto region = remat::alloc::TagScope::region("cuda.oom.small");
    small = at::empty({std::int64_t{64} << 20}, at::kCUDA);  // 256 MiB
  }
  c10::cuda::CUDACachingAllocator::setMemoryFraction(0.02, 0);  // about 2.8 GB of an H200
  {
    auto region = remat::alloc::TagScope::region("cuda.oom.request");
    EXPECT_THROW(at::empty({std::int64_t{1} << 30}, at::kCUDA), c10::OutOfMemoryError);  // 4 GiB
  }
  c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
  EXPECT_EQ(gpu0().stats().num_ooms, ooms + 1);

  std::vector<std::filesystem::path> reports;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) reports.push_back(entry.path());
  ASSERT_EQ(reports.size(), 1u);
  const auto report = nlohmann::json::parse(std::ifstream(reports[0]));
  EXPECT_EQ(report["kind"], "oom");
  EXPECT_EQ(report["backend"], "cuda");
  EXPECT_EQ(report["holders"]["by_region"][0]["name"], "cuda.oom.big");
  EXPECT_EQ(report["holders"]["by_region"][0]["bytes"], std::int64_t{1} << 30);
  EXPECT_EQ(report["request"]["requested_bytes"], std::int64_t{4} << 30);
  EXPECT_GT(report["memory"]["device_total_bytes"].get<std::uint64_t>(), std::uint64_t{16} << 30);
  std::filesystem::remove_all(dir);

  auto after = at::ones({kFloats}, at::kCUDA);  // training goes on
  EXPECT_EQ(after.sum().item<float>(), static_cast<float>(kFloats));
}

using remat::testing::StreamGate;

TEST(CudaAllocator, RecordStreamKeepsTheBlockUntilTheSideStreamsWorkIsDone) {
  // 64 MiB: larger than any free block once the cache is emptied (free blocks left in split
  // segments are under 20 MiB), so it gets a segment of its own and reuse hands out exactly it.
  constexpr std::int64_t kLargeFloats = 16 << 20;
  c10::cuda::CUDACachingAllocator::emptyCache();
  auto side = c10::cuda::getStreamFromPool();
  auto t = at::ones({kLargeFloats}, at::kCUDA);
  void* const address = t.data_ptr();
  t.mul_(1.0);  // loads the kernel now: a first launch may wait for the device, gate or not
  c10::cuda::device_synchronize();
  StreamGate gate(side.stream());
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    t.mul_(3.0);  // queued behind the gate
  }
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), side);
  const auto before = gpu0().stats();
  t = at::Tensor();
  const auto freed = gpu0().stats();
  EXPECT_EQ(freed.allocated_bytes.current, before.allocated_bytes.current - kLargeFloats * 4);
  EXPECT_EQ(freed.active_bytes.current, before.active_bytes.current) << "the side stream may still use it";

  auto while_pending = at::empty({kLargeFloats}, at::kCUDA);
  EXPECT_NE(while_pending.data_ptr(), address) << "handed out while the side stream still uses it";
  gate.release();
  side.synchronize();
  auto after = at::empty({kLargeFloats}, at::kCUDA);
  EXPECT_EQ(after.data_ptr(), address) << "not reused after the side stream finished";
  const auto settled = gpu0().stats();
  EXPECT_EQ(settled.active_bytes.current, settled.allocated_bytes.current);
}

int late_install() {
  auto before = at::empty({16}, at::kCUDA);  // LibTorch's own allocator is now in use
  try {
    remat::install_cuda_allocator();
  } catch (const remat::Error& e) {
    std::printf("refused as expected: %s\n", e.what());
    return std::strstr(e.what(), "before the first CUDA tensor") != nullptr ? 0 : 1;
  }
  std::printf("installing after LibTorch used CUDA memory was not refused\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (!remat::alloc::cuda_device_available()) {
    std::printf("no CUDA device visible: skipped\n");
    return 77;
  }
  if (argc > 1 && std::string(argv[1]) == "--late-install") return late_install();
  remat::install_cuda_allocator();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
