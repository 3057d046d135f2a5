#pragma once
// Shared helpers for the checkpoint runtime tests: the tagging CPU allocator installed for
// the whole test binary, and byte counts through the allocator's tags.

#include <remat/alloc/allocator.hpp>
#include <remat/diagnostics.hpp>
#include <remat/remat.hpp>

#include <ATen/core/grad_mode.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace remat::testing {

// Installs the tagging allocator as LibTorch's CPU allocator for every test.
class TaggingAllocatorEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    alloc::configure("backend:host,host_capacity_mb:1024");
    guard_ = std::make_unique<CpuAllocatorGuard>();
  }
  void TearDown() override { guard_.reset(); }

 private:
  std::unique_ptr<CpuAllocatorGuard> guard_;
};

inline std::int64_t float_bytes(std::int64_t count) { return count * static_cast<std::int64_t>(sizeof(float)); }

}  // namespace remat::testing
