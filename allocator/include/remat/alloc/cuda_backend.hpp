#pragma once
// The CUDA backend: cudaMalloc/cudaFree, cudaMemGetInfo and events for cross-stream reuse.
// Present only in builds where the CUDA toolkit was found (REMAT_ALLOC_HAVE_CUDA).

#include <remat/alloc/backend.hpp>

#include <memory>

namespace remat::alloc {

// True when this build has the CUDA backend and at least one GPU is visible.
bool cuda_device_available() noexcept;

// The CUDA backend for `device`. Throws BackendError when the build has no CUDA support
// or the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device);

// The calling thread's current CUDA device, or 0 without CUDA.
int current_cuda_device() noexcept;

}  // namespace remat::alloc
