// The caching allocator over the CUDA backend on a real GPU, without LibTorch: device
// memory from cudaMalloc, cudaMemGetInfo, per-stream pools, record_stream with real events,
// out-of-memory from the memory-fraction cap and from the device itself, and the C ABI of
// libremat_alloc.so (its own statically linked CUDA runtime) next to this program's, and
// expandable segments through the driver's virtual memory API.
// Exits 77 (skipped) where no GPU is visible.

#include "../../support/cuda_stream_gate.hpp"

#include <remat/alloc/c_api.h>
#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/cuda_backend.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/tags.hpp>

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace remat::alloc {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

std::unique_ptr<CachingAllocator> cuda_allocator(const std::string& conf = "") {
  Config config = Config::parse(conf, Config{});
  config.backend = BackendKind::cuda;
  return std::make_unique<CachingAllocator>(make_cuda_backend(0), config);
}

Stream as_stream(cudaStream_t stream) { return reinterpret_cast<Stream>(stream); }

struct DeviceMemory {
  std::size_t free = 0;
  std::size_t total = 0;
};

DeviceMemory device_memory() {
  DeviceMemory m;
  EXPECT_EQ(cudaMemGetInfo(&m.free, &m.total), cudaSuccess);
  return m;
}

// A non-blocking stream, destroyed with the object.
class OwnedStream {
 public:
  OwnedStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess); }
  ~OwnedStream() { cudaStreamDestroy(stream_); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return stream_; }
  Stream handle() const { return as_stream(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
};

using remat::testing::StreamGate;

TEST(CudaBackend, BlocksAreDeviceMemoryThatHoldsWhatIsWritten) {
  auto allocator = cuda_allocator();
  void* ptr = allocator->allocate(MiB, 0);
  cudaPointerAttributes attributes{};
  CUDA_OK(cudaPointerGetAttributes(&attributes, ptr));
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);
  std::vector<unsigned char> out(MiB), in(MiB);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 7 + 3);
  CUDA_OK(cudaMemcpy(ptr, out.data(), MiB, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(in.data(), ptr, MiB, cudaMemcpyDeviceToHost));
  EXPECT_EQ(in, out);
  allocator->deallocate(ptr, MiB);
}

TEST(CudaBackend, MemoryInfoIsCudaMemGetInfo) {
  auto allocator = cuda_allocator();
  const DeviceMemoryInfo info = allocator->backend().memory_info();
  const DeviceMemory direct = device_memory();
  EXPECT_EQ(info.total_bytes, direct.total);
  EXPECT_GT(info.total_bytes, std::size_t{16} << 30);
  EXPECT_LE(info.free_bytes, info.total_bytes);
  EXPECT_EQ(allocator->snapshot().memory.total_bytes, direct.total);
}

TEST(CudaBackend, SegmentsComeFromCudaMallocAndEmptyCacheGivesThemBack) {
  auto allocator = cuda_allocator();
  const std::size_t size = 256 * MiB;
  const DeviceMemory before = device_memory();
  void* ptr = allocator->allocate(size, 0);
  const DeviceMemory held = device_memory();
  EXPECT_GE(before.free - held.free, size);
  EXPECT_EQ(allocator->stats().reserved_bytes.current, static_cast<std::int64_t>(size));

  allocator->deallocate(ptr, size);
  EXPECT_EQ(device_memory().free, held.free) << "a freed block stays cached";
  EXPECT_EQ(allocator->allocate(size, 0), ptr) << "and is handed out again";
  allocator->deallocate(ptr, size);

  allocator->empty_cache();
  EXPECT_EQ(allocator->stats().reserved_bytes.current, 0);
  EXPECT_GE(device_memory().free, held.free + size);
}

TEST(CudaExpandableSegments, GrowByMappingDeviceMemoryAndShrinkAtEmptyCache) {
  auto allocator = cuda_allocator("expandable_segments:True");
  ASSERT_EQ(allocator->backend().granularity(), 2 * MiB) << "the driver's minimum granularity";
  const DeviceMemory before = device_memory();
  void* first = allocator->allocate(30 * MiB, 0);
  void* second = allocator->allocate(300 * MiB, 0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(second), reinterpret_cast<std::uintptr_t>(first) + 30 * MiB);
  EXPECT_EQ(allocator->stats().reserved_bytes.current, static_cast<std::int64_t>(340 * MiB));
  EXPECT_GE(before.free - device_memory().free, 330 * MiB);
  const AllocatorSnapshot snap = allocator->snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_TRUE(snap.segments[0].is_expandable);

  // The memory holds what is written across the boundary of the two mappings (at 40 MiB).
  std::vector<unsigned char> out(64 * MiB), in(64 * MiB);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 13 + 1);
  CUDA_OK(cudaMemcpy(second, out.data(), out.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(in.data(), second, in.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(in, out);
  CUDA_OK(cudaMemset(first, 0, 330 * MiB));  // one kernel over both mappings
  CUDA_OK(cudaDeviceSynchronize());

  allocator->deallocate(second, 300 * MiB);
  allocator->empty_cache();
  EXPECT_EQ(allocator->stats().reserved_bytes.current, static_cast<std::int64_t>(30 * MiB));
  allocator->deallocate(first, 30 * MiB);
  allocator->empty_cache();
  EXPECT_EQ(allocator->stats().reserved_bytes.current, 0);
  EXPECT_GE(device_memory().free + 4 * MiB, before.free) << "the physical memory went back to the driver";
}

TEST(CudaExpandableSegments, DeviceOutOfMemoryIsAnErrorThatLeavesCudaUsable) {
  auto allocator = cuda_allocator("expandable_segments:True");
  void* held = allocator->allocate(64 * MiB, 0);
  EXPECT_THROW(allocator->allocate(device_memory().total, 0), OutOfMemoryError);
  void* again = allocator->allocate(64 * MiB, 0);
  CUDA_OK(cudaMemset(again, 1, 64 * MiB));
  CUDA_OK(cudaDeviceSynchronize());
  allocator->deallocate(again, 64 * MiB);
  allocator->deallocate(held, 64 * MiB);
}

TEST(CudaBackend, BlocksAreReusedOnlyOnTheStreamTheyWereAllocatedOn) {
  auto allocator = cuda_allocator();
  OwnedStream first, second;
  void* a = allocator->allocate(MiB, first.handle());
  allocator->deallocate(a, MiB);
  void* b = allocator->allocate(MiB, second.handle());
  EXPECT_NE(b, a);
  void* c = allocator->allocate(MiB, first.handle());
  EXPECT_EQ(c, a);
  allocator->deallocate(b, MiB);
  allocator->deallocate(c, MiB);
}

TEST(CudaBackend, RecordStreamKeepsABlockUntilTheOtherStreamsWorkCompletes) {
  auto allocator = cuda_allocator();
  OwnedStream home, side;
  constexpr std::size_t size = 4 * MiB;
  void* a = allocator->allocate(size, home.handle());
  StreamGate gate(side.get());
  CUDA_OK(cudaMemsetAsync(a, 0x11, size, side.get()));  // queued behind the gate
  allocator->record_stream(a, side.handle());
  allocator->deallocate(a, size);
  const AllocatorStats freed = allocator->stats();
  EXPECT_EQ(freed.allocated_bytes.current, 0);
  EXPECT_EQ(freed.active_bytes.current, static_cast<std::int64_t>(size)) << "the side stream may still write it";

  void* b = allocator->allocate(size, home.handle());
  EXPECT_NE(b, a) << "reused while the side stream's work is still queued";

  gate.release();
  CUDA_OK(cudaStreamSynchronize(side.get()));
  void* c = allocator->allocate(size, home.handle());
  EXPECT_EQ(c, a) << "not reused after the side stream finished";
  allocator->deallocate(b, size);
  allocator->deallocate(c, size);
  EXPECT_EQ(allocator->stats().active_bytes.current, 0);
}

// With nothing queued on the side stream its event completes as soon as the GPU processes
// the record, which is asynchronous: the block is free for reuse once that event is done,
// not necessarily at the very next allocation. Waiting on the stream makes it certain.
TEST(CudaBackend, RecordStreamOnAnIdleStreamFreesOnceItsEventIsProcessed) {
  auto allocator = cuda_allocator();
  OwnedStream home, side;
  constexpr std::size_t size = 4 * MiB;
  void* a = allocator->allocate(size, home.handle());
  allocator->record_stream(a, side.handle());
  allocator->deallocate(a, size);
  EXPECT_EQ(allocator->stats().active_bytes.current, static_cast<std::int64_t>(size));
  CUDA_OK(cudaStreamSynchronize(side.get()));
  void* b = allocator->allocate(size, home.handle());
  EXPECT_EQ(b, a);
  allocator->deallocate(b, size);
  EXPECT_EQ(allocator->stats().active_bytes.current, 0);
}

TEST(CudaBackend, EmptyCacheWaitsForNothingAndKeepsPendingBlocks) {
  auto allocator = cuda_allocator();
  OwnedStream home, side;
  constexpr std::size_t size = 32 * MiB;
  void* a = allocator->allocate(size, home.handle());
  StreamGate gate(side.get());
  allocator->record_stream(a, side.handle());
  allocator->deallocate(a, size);
  allocator->empty_cache();  // the segment is still in use by the side stream
  EXPECT_EQ(allocator->stats().reserved_bytes.current, static_cast<std::int64_t>(size));
  gate.release();
  CUDA_OK(cudaStreamSynchronize(side.get()));
  allocator->empty_cache();
  EXPECT_EQ(allocator->stats().reserved_bytes.current, 0);
}

TEST(CudaBackend, MemoryFractionCapIsAnOutOfMemoryErrorThatLeavesCudaUsable) {
  auto allocator = cuda_allocator("memory_fraction:0.01");
  const std::size_t cap = device_memory().total / 100;
  try {
    allocator->allocate(cap + 64 * MiB, 0);
    FAIL() << "a request above the memory-fraction cap succeeded";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on device 0 (cuda)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(allocator->stats().num_ooms, 1u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* ptr = allocator->allocate(64 * MiB, 0);
  EXPECT_NE(ptr, nullptr);
  allocator->deallocate(ptr, 64 * MiB);
}

TEST(CudaBackend, ARequestLargerThanTheDeviceIsOutOfMemoryAndCudaStaysUsable) {
  auto allocator = cuda_allocator();
  void* held = allocator->allocate(64 * MiB, 0);
  const std::size_t too_much = device_memory().total + (std::size_t{1} << 30);
  EXPECT_THROW(allocator->allocate(too_much, 0), OutOfMemoryError);
  EXPECT_EQ(allocator->stats().num_ooms, 1u);
  EXPECT_EQ(allocator->stats().num_alloc_retries, 1u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed cudaMalloc left an error behind";
  void* ptr = nullptr;
  CUDA_OK(cudaMalloc(&ptr, MiB));
  CUDA_OK(cudaFree(ptr));
  EXPECT_EQ(allocator->stats().allocated_bytes.current, static_cast<std::int64_t>(64 * MiB));
  allocator->deallocate(held, 64 * MiB);
}

TEST(CudaBackend, TwoThreadsOnTheirOwnStreamsKeepTheStatisticsExact) {
  auto allocator = cuda_allocator();
  auto worker = [&](std::size_t seed) {
    OwnedStream stream;
    std::vector<std::pair<void*, std::size_t>> live;
    std::size_t state = seed;
    for (int i = 0; i < 20000; ++i) {
      state = state * 6364136223846793005u + 1442695040888963407u;
      const std::size_t size = std::size_t{512} << (state >> 60) % 14;  // 512 B .. 4 MiB
      auto region = TagScope::region(seed == 1 ? "thread.one" : "thread.two");
      live.emplace_back(allocator->allocate(size, stream.handle()), size);
      if (live.size() > 32) {
        const std::size_t victim = (state >> 20) % live.size();
        allocator->deallocate(live[victim].first, live[victim].second);
        live[victim] = live.back();
        live.pop_back();
      }
    }
    for (const auto& [ptr, size] : live) allocator->deallocate(ptr, size);
  };
  std::thread one(worker, 1), two(worker, 2);
  one.join();
  two.join();
  const AllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.allocations.current, 0);
  EXPECT_EQ(stats.allocations.total_added, 40000u);
  EXPECT_EQ(allocator->live_requested_bytes("thread.one"), 0);
  allocator->empty_cache();
  EXPECT_EQ(allocator->stats().reserved_bytes.current, 0);
}

// The shared library PyTorch loads, with its own static CUDA runtime: its pointers are
// device memory this program's runtime can use, on this program's streams.
TEST(CudaSharedLibrary, CApiAllocatesDeviceMemoryOnTheCallersStream) {
  void* lib = dlopen(REMAT_ALLOC_SHARED_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto configure = reinterpret_cast<int (*)(const char*)>(dlsym(lib, "remat_configure"));
  auto alloc = reinterpret_cast<void* (*)(size_t, int, cudaStream_t)>(dlsym(lib, "remat_alloc"));
  auto release = reinterpret_cast<void (*)(void*, size_t, int, cudaStream_t)>(dlsym(lib, "remat_free"));
  auto live_bytes = reinterpret_cast<int (*)(int, const char*, int64_t*)>(dlsym(lib, "remat_live_bytes"));
  auto push_region = reinterpret_cast<int (*)(const char*)>(dlsym(lib, "remat_push_region"));
  auto pop_region = reinterpret_cast<int (*)()>(dlsym(lib, "remat_pop_region"));
  ASSERT_TRUE(configure && alloc && release && live_bytes && push_region && pop_region);
  ASSERT_EQ(configure("backend:cuda"), 0);

  OwnedStream stream;
  ASSERT_EQ(push_region("c.api"), 0);
  void* ptr = alloc(3 * MiB, 0, stream.get());
  ASSERT_EQ(pop_region(), 0);
  ASSERT_NE(ptr, nullptr);
  int64_t live = 0;
  ASSERT_EQ(live_bytes(0, "c.api", &live), 0);
  EXPECT_EQ(live, static_cast<int64_t>(3 * MiB));
  CUDA_OK(cudaMemsetAsync(ptr, 0x7f, 3 * MiB, stream.get()));
  unsigned char last = 0;
  CUDA_OK(cudaMemcpyAsync(&last, static_cast<unsigned char*>(ptr) + 3 * MiB - 1, 1, cudaMemcpyDeviceToHost,
                          stream.get()));
  CUDA_OK(cudaStreamSynchronize(stream.get()));
  EXPECT_EQ(last, 0x7f);
  release(ptr, 3 * MiB, 0, stream.get());
  ASSERT_EQ(live_bytes(0, "c.api", &live), 0);
  EXPECT_EQ(live, 0);
}

}  // namespace
}  // namespace remat::alloc

int main(int argc, char** argv) {
  if (!remat::alloc::cuda_device_available()) {
    std::printf("no CUDA device visible: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
