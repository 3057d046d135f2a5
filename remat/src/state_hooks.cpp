#include <remat/state_hooks.hpp>

#include "generator_states.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

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

// A CUDA generator's whole state is its seed and its Philox offset (what get_state() packs into a
// tensor); kept as values for the same reason as the CPU one's.
struct CudaGeneratorState {
  c10::DeviceIndex device;
  std::uint64_t seed;
  std::uint64_t offset;
};

// The default generators of the CUDA devices that have a context, reached through LibTorch's
// device-generic hooks in libtorch_cpu: the core links no CUDA library, and where LibTorch has
// no CUDA (or sees no device) hasCUDA() is false and this keeps nothing. A device without a
// context has run no kernel, so no draw on it can be recomputed yet; asking for its generator
// could create the context (hundreds of MiB) in a program that never used the device.
class CudaRngStatesHook final : public RecomputeStateHook {
 public:
  std::any snapshot() override {
    std::vector<CudaGeneratorState> states;
    if (!at::detail::getCUDAHooks().hasCUDA()) return states;
    const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
    for (c10::DeviceIndex device = 0; device < hooks.deviceCount(); ++device) {
      if (!hooks.hasPrimaryContext(device)) continue;
      at::Generator generator = hooks.getDefaultGenerator(device);
      std::lock_guard<std::mutex> lock(generator.mutex());
      states.push_back({device, generator.current_seed(), generator.get_offset()});
    }
    return states;
  }

  void restore(const std::any& state) override {
    const auto& saved = std::any_cast<const std::vector<CudaGeneratorState>&>(state);
    if (saved.empty()) return;
    const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
    for (const CudaGeneratorState& each : saved) {
      at::Generator generator = hooks.getDefaultGenerator(each.device);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_current_seed(each.seed);  // also zeroes the offset: set it after
      generator.set_offset(each.offset);
    }
  }
};

}  // namespace

std::shared_ptr<RecomputeStateHook> cpu_rng_state_hook() { return std::make_shared<CpuRngStateHook>(); }

namespace detail {
std::shared_ptr<RecomputeStateHook> cuda_generators_state_hook() { return std::make_shared<CudaRngStatesHook>(); }

namespace {
struct GeneratorStates {
  CpuRngState cpu;
  std::vector<CudaGeneratorState> cuda;
};

bool same_engine(const at::mt19937& a, const at::mt19937& b) {
  const at::mt19937_data_pod x = a.data(), y = b.data();
  return x.seed_ == y.seed_ && x.left_ == y.left_ && x.seeded_ == y.seeded_ && x.next_ == y.next_ &&
         x.state_ == y.state_;
}
}  // namespace

std::any generator_states() {
  return GeneratorStates{std::any_cast<CpuRngState>(CpuRngStateHook().snapshot()),
                         std::any_cast<std::vector<CudaGeneratorState>>(CudaRngStatesHook().snapshot())};
}

bool same_generator_states(const std::any& before, const std::any& after) {
  const auto& a = std::any_cast<const GeneratorStates&>(before);
  const auto& b = std::any_cast<const GeneratorStates&>(after);
  if (!same_engine(a.cpu.engine, b.cpu.engine) || a.cpu.next_float_normal_sample != b.cpu.next_float_normal_sample ||
      a.cpu.next_double_normal_sample != b.cpu.next_double_normal_sample) {
    return false;
  }
  // A device whose context was created in between (by the recompute itself, say) had no draws
  // before it: its generator moved only where its offset left zero.
  for (const CudaGeneratorState& now : b.cuda) {
    auto then = std::find_if(a.cuda.begin(), a.cuda.end(), [&](const auto& s) { return s.device == now.device; });
    if (then == a.cuda.end() ? now.offset != 0 : then->seed != now.seed || then->offset != now.offset) return false;
  }
  return true;
}
}  // namespace detail

}  // namespace remat
