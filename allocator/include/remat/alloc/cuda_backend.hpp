#pragma once
// The CUDA backend: cudaMalloc/cudaFree, cudaMemGetInfo and events for cross-stream reuse.
// Present only in builds where the CUDA toolkit was found (REMAT_ALLOC_HAVE_CUDA).

#include <remat/alloc/backend.hpp>

#include <cstddef>
#include <memory>

namespace remat::alloc {

// True when this build has the CUDA backend and at least one GPU is visible.
bool cuda_device_available() noexcept;

// The CUDA backend for `device`. Throws BackendError when the build has no CUDA support
// or the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device);

// Page-locked host memory (cudaHostAlloc), up to `capacity_bytes`: what host copies of device
// tensors come from, so that copies to and from the device run asynchronously. Its events are
// complete at once: whoever copies through a block orders the copies (remat.CpuOffload waits
// on its own copy events before a buffer goes back). Throws BackendError without CUDA.
std::unique_ptr<Backend> make_pinned_host_backend(std::size_t capacity_bytes);

// The calling thread's current CUDA device, or 0 without CUDA.
int current_cuda_device() noexcept;

}  // namespace remat::alloc
