#include <remat/state_hooks.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <mutex>
#include <optional>

namespace remat {
namespace {

// The generator's state as plain values (its engine and the cached normal samples), not the
// tensor get_state() makes: a snapshot per checkpoint call and save region is no tensor memory,
// so what a step counts does not depend on how many snapshots its plan takes.
struct CpuRngState {
  at::mt19937 engine;
  std::optional<float> next_float_normal_sample;
  std::optional<double> next_double_normal_sample;
};

class CpuRngStateHook final : public RecomputeStateHook {
 public:
  std::any snapshot() override {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    auto* cpu = at::check_generator<at::CPUGeneratorImpl>(generator);
    return CpuRngState{cpu->engine(), cpu->next_float_normal_sample(), cpu->next_double_normal_sample()};
  }

  void restore(const std::any& state) override {
    const auto& saved = std::any_cast<const CpuRngState&>(state);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    auto* cpu = at::check_generator<at::CPUGeneratorImpl>(generator);
    cpu->set_engine(saved.engine);
    cpu->set_next_float_normal_sample(saved.next_float_normal_sample);
    cpu->set_next_double_normal_sample(saved.next_double_normal_sample);
  }
};

}  // namespace

std::shared_ptr<RecomputeStateHook> cpu_rng_state_hook() { return std::make_shared<CpuRngStateHook>(); }

}  // namespace remat
