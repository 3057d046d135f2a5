#pragma once
// Holds a CUDA stream's queue at a host function until release() (or 20 s, so a failing test
// cannot hang): work queued behind it stays incomplete meanwhile.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace remat::testing {

class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &StreamGate::wait, &open_), cudaSuccess);
  }
  ~StreamGate() { release(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void release() { open_.store(true); }

 private:
  static void CUDART_CB wait(void* flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!static_cast<std::atomic<bool>*>(flag)->load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  std::atomic<bool> open_{false};
};

}  // namespace remat::testing
