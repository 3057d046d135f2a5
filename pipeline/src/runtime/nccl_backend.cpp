#include "runtime/nccl_backend.hpp"

#include <remat/pipeline/errors.hpp>

#if defined(REMAT_PIPELINE_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace remat::pipeline::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout) {
#if defined(REMAT_PIPELINE_WITH_NCCL)
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
#else
  (void)store, (void)rank, (void)world_size, (void)timeout;
  throw RuntimeError(
      "this build has no NCCL backend (it needs NCCL and LibTorch's CUDA libraries at build time); use the gloo "
      "backend with CPU tensors, or rebuild on a CUDA machine");
#endif
}

}  // namespace remat::pipeline::detail
