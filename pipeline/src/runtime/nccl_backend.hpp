#pragma once
// c10d's NCCL process group, on builds with NCCL and LibTorch's CUDA libraries
// (REMAT_PIPELINE_WITH_NCCL); elsewhere make_nccl_backend throws RuntimeError saying so.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace remat::pipeline::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout);

}  // namespace remat::pipeline::detail
