#include <remat/cuda_state_hooks.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>

#include <mutex>

namespace remat {
namespace {

class CudaRngStateHook final : public RecomputeStateHook {
 public:
  explicit CudaRngStateHook(c10::DeviceIndex device) : device_(device) {}

  std::any snapshot() override {
    at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(device_);
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }

  void restore(const std::any& state) override {
    at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(device_);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(std::any_cast<const at::Tensor&>(state));
  }

 private:
  c10::DeviceIndex device_;
};

}  // namespace

std::shared_ptr<RecomputeStateHook> cuda_rng_state_hook(int device) {
  const auto index = static_cast<c10::DeviceIndex>(device < 0 ? c10::cuda::current_device() : device);
  return std::make_shared<CudaRngStateHook>(index);
}

}  // namespace remat
