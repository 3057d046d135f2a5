#include <remat/alloc/cuda_backend.hpp>
#include <remat/alloc/errors.hpp>

#include <string>

#if REMAT_ALLOC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace remat::alloc {

#if REMAT_ALLOC_HAVE_CUDA
namespace {

void check(cudaError_t status, const char* what, int device) {
  if (status == cudaSuccess) return;
  throw BackendError(std::string(what) + " failed on device " + std::to_string(device) + ": " +
                     cudaGetErrorString(status));
}

// Runs CUDA calls with `device` current and puts the caller's device back afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice", device);
    switched_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}

  std::string_view name() const override { return "cuda"; }
  int device() const override { return device_; }

  void* allocate(std::size_t bytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it so later CUDA calls do not report it
      return nullptr;
    }
    check(status, "cudaMalloc", device_);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t) override {
    DeviceGuard guard(device_);
    check(cudaFree(ptr), "cudaFree", device_);
  }

  DeviceMemoryInfo memory_info() override {
    DeviceGuard guard(device_);
    DeviceMemoryInfo info;
    check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo", device_);
    return info;
  }

  Event record_event(Stream stream) override {
    DeviceGuard guard(device_);
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags", device_);
    check(cudaEventRecord(event, reinterpret_cast<cudaStream_t>(stream)), "cudaEventRecord", device_);
    return event;
  }

  bool event_completed(Event event) override {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(status, "cudaEventQuery", device_);
    return true;
  }

  bool wait_event(Event event) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize", device_);
    return true;
  }

  void destroy_event(Event event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

 private:
  int device_;
};

}  // namespace

bool cuda_device_available() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", device);
  if (device < 0 || device >= count) {
    throw BackendError("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                       " visible); pass a device index below " + std::to_string(count));
  }
  return std::make_unique<CudaBackend>(device);
}

int current_cuda_device() noexcept {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return device;
}

#else

bool cuda_device_available() noexcept { return false; }

std::unique_ptr<Backend> make_cuda_backend(int) {
  throw BackendError("this build of remat has no CUDA backend; rebuild where the CUDA toolkit is found, "
                     "or set REMAT_ALLOC_CONF=backend:host");
}

int current_cuda_device() noexcept { return 0; }

#endif

}  // namespace remat::alloc
