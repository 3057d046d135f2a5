// The tagging allocator as LibTorch's CUDA allocator, on a real GPU. Registered only on
// CUDA builds and skipped (exit 77) where no GPU is present.
//
//   remat_cuda_tests                 the suite; installs the allocator before any CUDA use
//   remat_cuda_tests --late-install  exits 0 when installing after LibTorch used its own
//                                    CUDA allocator is refused with a clear error

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/cuda_allocator.hpp>
#include <remat/remat.hpp>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

constexpr std::int64_t kFloats = 1 << 16;
constexpr std::int64_t kBytes = kFloats * 4;

remat::alloc::CachingAllocator& gpu0() { return remat::alloc::device_allocator(0); }

TEST(CudaAllocator, IsInstalledOnceAndAgainIsANoOp) {
  EXPECT_TRUE(remat::cuda_allocator_installed());
  remat::install_cuda_allocator();
  EXPECT_TRUE(remat::cuda_allocator_installed());
}

TEST(CudaAllocator, CudaTensorsCarryTheTagsInForce) {
  at::Tensor t;
  {
    auto region = remat::alloc::TagScope::region("cuda.tagged");
    t = at::empty({kFloats}, at::kCUDA);
  }
  EXPECT_EQ(remat::live_bytes("cuda.tagged"), kBytes);
  EXPECT_EQ(gpu0().tag_of_block(t.data_ptr()).has_value(), true);
  t = at::Tensor();
  EXPECT_EQ(remat::live_bytes("cuda.tagged"), 0);
}

TEST(CudaAllocator, CheckpointKeepsOnlyWhatBackwardNeedsAndGradientsMatch) {
  at::manual_seed(0);
  auto w = at::rand({kFloats}, at::kCUDA).requires_grad_(true);
  auto body = [](const at::Tensor& x) {
    auto y = remat::region([](const at::Tensor& t) { return t.exp(); }, "A", /*recompute=*/false)(x);
    return remat::region([](const at::Tensor& t) { return (t * 3.0).exp(); }, "B")(y);
  };
  at::Tensor loss;
  {
    at::Tensor x;
    {
      auto input = remat::alloc::TagScope::region("cuda.input");
      x = w * 2.0;
    }
    loss = remat::checkpoint({.region_name = "cuda.ckpt"})(body)(x).sum();
  }
  // A saves y (persisted: B consumes it); B is recomputed, so neither the input nor B's
  // internals stay resident.
  EXPECT_EQ(remat::live_bytes("cuda.input") + remat::live_bytes("cuda.ckpt"), kBytes);
  loss.backward();
  auto reference = w.detach().clone().requires_grad_(true);
  body(reference * 2.0).sum().backward();
  EXPECT_TRUE(at::equal(w.grad(), reference.grad()));
  EXPECT_EQ(remat::live_bytes("cuda.ckpt"), 0);
}

TEST(CudaAllocator, LibTorchsEmptyCacheReachesTheTaggingAllocator) {
  auto t = at::empty({64 << 20}, at::kCUDA);  // 256 MiB
  const std::int64_t reserved = gpu0().stats().reserved_bytes.current;
  t = at::Tensor();
  c10::cuda::CUDACachingAllocator::emptyCache();
  EXPECT_LE(gpu0().stats().reserved_bytes.current, reserved - (std::int64_t{256} << 20));
}

TEST(CudaAllocator, OutOfMemoryIsLibTorchsErrorAndCounted) {
  const std::uint64_t ooms = gpu0().stats().num_ooms;
  c10::cuda::CUDACachingAllocator::setMemoryFraction(0.01, 0);
  EXPECT_THROW(at::empty({std::int64_t{4} << 30}, at::kCUDA), c10::OutOfMemoryError);  // 16 GiB
  c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
  EXPECT_EQ(gpu0().stats().num_ooms, ooms + 1);
  EXPECT_NO_THROW(at::empty({kFloats}, at::kCUDA));
}

TEST(CudaAllocator, RecordStreamDefersTheFreeUntilThatStreamIsDone) {
  auto side = c10::cuda::getStreamFromPool();
  auto t = at::ones({kFloats}, at::kCUDA);
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), side);
  const auto before = gpu0().stats();
  t = at::Tensor();
  const auto freed = gpu0().stats();
  EXPECT_LT(freed.allocated_bytes.current, before.allocated_bytes.current);
  EXPECT_EQ(freed.active_bytes.current, before.active_bytes.current);  // the side stream may still read it
  c10::cuda::device_synchronize();
  auto next = at::zeros({16}, at::kCUDA);  // retires the completed event
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
  if (argc > 1 && std::string(argv[1]) == "--late-install") return late_install();
  remat::install_cuda_allocator();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
