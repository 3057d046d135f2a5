#include <remat/alloc/cuda_backend.hpp>
#include <remat/alloc/errors.hpp>

#include <string>
#include <type_traits>

#if REMAT_ALLOC_HAVE_CUDA
#include <cuda.h>  // the driver's types; its functions are looked up at run time
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <unordered_map>
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

// The driver's virtual memory API, for expandable segments. libcuda is opened when first
// needed rather than linked, so the library still loads where no driver is installed; there
// expandable segments are refused with a message.
struct DriverApi {
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;

  // nullptr when libcuda.so.1 or one of the functions is missing.
  static const DriverApi* get() {
    static const DriverApi* api = load();
    return api;
  }

 private:
  static const DriverApi* load() {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return nullptr;
    static DriverApi api;
    bool complete = true;
    auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, name));
      complete = complete && fn != nullptr;
    };
    find(api.address_reserve, "cuMemAddressReserve");
    find(api.address_free, "cuMemAddressFree");
    find(api.create, "cuMemCreate");
    find(api.release, "cuMemRelease");
    find(api.map, "cuMemMap");
    find(api.unmap, "cuMemUnmap");
    find(api.set_access, "cuMemSetAccess");
    find(api.granularity, "cuMemGetAllocationGranularity");
    find(api.error_string, "cuGetErrorString");
    return complete ? &api : nullptr;
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device), driver_(DriverApi::get()) {
    if (driver_ == nullptr) return;
    properties_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    properties_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    properties_.location.id = device;
    std::size_t granularity = 0;
    if (driver_->granularity(&granularity, &properties_, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS) {
      granularity_ = granularity;
    }
  }

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

  std::size_t granularity() const override { return granularity_; }

  void* reserve(std::size_t bytes) override {
    DeviceGuard guard(device_);
    check(cudaFree(nullptr), "cudaFree(nullptr) (creating the device's context)", device_);
    CUdeviceptr address = 0;
    if (driver_->address_reserve(&address, bytes, 0, 0, 0) != CUDA_SUCCESS) return nullptr;
    return reinterpret_cast<void*>(address);
  }

  // One physical allocation per granule, so that any granule-aligned tail can be unmapped.
  bool map(void* address, std::size_t bytes) override {
    DeviceGuard guard(device_);
    const auto base = reinterpret_cast<CUdeviceptr>(address);
    for (std::size_t offset = 0; offset < bytes; offset += granularity_) {
      CUmemGenericAllocationHandle handle = 0;
      const CUresult created = driver_->create(&handle, granularity_, &properties_, 0);
      if (created == CUDA_ERROR_OUT_OF_MEMORY) {
        if (offset > 0) unmap(address, offset);
        return false;
      }
      check_driver(created, "cuMemCreate");
      const CUresult mapped = driver_->map(base + offset, granularity_, 0, handle, 0);
      if (mapped != CUDA_SUCCESS) {
        driver_->release(handle);
        if (offset > 0) unmap(address, offset);
        check_driver(mapped, "cuMemMap");
      }
      handles_.emplace(base + offset, handle);
    }
    CUmemAccessDesc access{};
    access.location = properties_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const CUresult granted = driver_->set_access(base, bytes, &access, 1);
    if (granted != CUDA_SUCCESS) {
      unmap(address, bytes);
      check_driver(granted, "cuMemSetAccess");
    }
    return true;
  }

  void unmap(void* address, std::size_t bytes) override {
    DeviceGuard guard(device_);
    const auto base = reinterpret_cast<CUdeviceptr>(address);
    for (std::size_t offset = 0; offset < bytes; offset += granularity_) {
      const auto it = handles_.find(base + offset);
      if (it == handles_.end()) continue;
      check_driver(driver_->unmap(base + offset, granularity_), "cuMemUnmap");
      check_driver(driver_->release(it->second), "cuMemRelease");
      handles_.erase(it);
    }
  }

  void release(void* address, std::size_t bytes) override {
    DeviceGuard guard(device_);
    check_driver(driver_->address_free(reinterpret_cast<CUdeviceptr>(address), bytes), "cuMemAddressFree");
  }

 private:
  void check_driver(CUresult status, const char* what) const {
    if (status == CUDA_SUCCESS) return;
    const char* text = nullptr;
    if (driver_->error_string(status, &text) != CUDA_SUCCESS || text == nullptr) text = "unknown driver error";
    throw BackendError(std::string(what) + " failed on device " + std::to_string(device_) + ": " + text);
  }

  int device_;
  const DriverApi* driver_;
  CUmemAllocationProp properties_{};
  std::size_t granularity_ = 0;  // 0: no driver virtual memory API, no expandable segments
  std::unordered_map<CUdeviceptr, CUmemGenericAllocationHandle> handles_;  // by mapped granule
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

namespace {

class PinnedHostBackend final : public Backend {
 public:
  explicit PinnedHostBackend(std::size_t capacity_bytes) : capacity_(capacity_bytes) {}

  std::string_view name() const override { return "pinned_host"; }
  int device() const override { return 0; }
  void* allocate(std::size_t bytes) override {
    if (bytes > capacity_ - used_) return nullptr;
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    check(status, "cudaHostAlloc", 0);
    used_ += bytes;
    return ptr;
  }
  void deallocate(void* ptr, std::size_t bytes) override {
    cudaFreeHost(ptr);
    used_ -= bytes;
  }
  DeviceMemoryInfo memory_info() override { return {capacity_ - used_, capacity_}; }
  Event record_event(Stream) override { return nullptr; }
  bool event_completed(Event) override { return true; }
  bool wait_event(Event) override { return true; }
  void destroy_event(Event) override {}

 private:
  std::size_t capacity_;
  std::size_t used_ = 0;  // the pool calls under its lock
};

}  // namespace

std::unique_ptr<Backend> make_pinned_host_backend(std::size_t capacity_bytes) {
  return std::make_unique<PinnedHostBackend>(capacity_bytes);
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

std::unique_ptr<Backend> make_pinned_host_backend(std::size_t) {
  throw BackendError("this build of remat has no CUDA backend, so no page-locked host memory; rebuild where the CUDA "
                     "toolkit is found");
}

int current_cuda_device() noexcept { return 0; }

#endif

}  // namespace remat::alloc
