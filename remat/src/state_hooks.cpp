#include <remat/state_hooks.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>

#include <mutex>

namespace remat {
namespace {

class CpuRngStateHook final : public RecomputeStateHook {
 public:
  std::any snapshot() override {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }

  void restore(const std::any& state) override {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(std::any_cast<const at::Tensor&>(state));
  }
};

}  // namespace

std::shared_ptr<RecomputeStateHook> cpu_rng_state_hook() { return std::make_shared<CpuRngStateHook>(); }

}  // namespace remat
