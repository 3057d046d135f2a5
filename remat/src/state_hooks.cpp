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

// The default generators of the CUDA devices that have a context, reached through LibTorch's
// device-generic hooks in libtorch_cpu: the core links no CUDA library, and where LibTorch has
// no CUDA (or sees no device) hasCUDA() is false and this lists none. A device without a
// context has run no kernel, so no draw on it can be recomputed yet; asking for its generator
// could create the context (hundreds of MiB) in a program that never used the device. A CUDA
// generator's whole state is its seed and its Philox offset (what get_state() packs into a
// tensor): kept as values for the same reason as the CPU one's.
std::vector<detail::CudaGeneratorMark> cuda_generators() {
  std::vector<detail::CudaGeneratorMark> states;
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

class CudaRngStatesHook final : public RecomputeStateHook {
 public:
  std::any snapshot() override { return cuda_generators(); }

  void restore(const std::any& state) override {
    const auto& saved = std::any_cast<const std::vector<detail::CudaGeneratorMark>&>(state);
    if (saved.empty()) return;
    const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
    for (const detail::CudaGeneratorMark& each : saved) {
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

GeneratorMarks generator_marks() {
  GeneratorMarks marks;
  {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    auto* cpu = at::check_generator<at::CPUGeneratorImpl>(generator);
    const at::mt19937 engine = cpu->engine();
    const at::mt19937_data_pod& data = engine.data();
    marks.cpu_seed = data.seed_;
    marks.cpu_left = static_cast<std::uint32_t>(data.left_);
    marks.cpu_next = data.next_;
    marks.cpu_first_word = data.state_[0];
    marks.cpu_seeded = data.seeded_;
    marks.cpu_float_normal = cpu->next_float_normal_sample();
    marks.cpu_double_normal = cpu->next_double_normal_sample();
  }
  marks.cuda = cuda_generators();
  return marks;
}

bool same_generator_marks(const GeneratorMarks& a, const GeneratorMarks& b) {
  if (a.cpu_seed != b.cpu_seed || a.cpu_left != b.cpu_left || a.cpu_next != b.cpu_next ||
      a.cpu_first_word != b.cpu_first_word || a.cpu_seeded != b.cpu_seeded ||
      a.cpu_float_normal != b.cpu_float_normal || a.cpu_double_normal != b.cpu_double_normal) {
    return false;
  }
  // A device whose context was created in between (by the recompute itself, say) had no draws
  // before it: its generator moved only where its offset left zero.
  for (const CudaGeneratorMark& now : b.cuda) {
    auto then = std::find_if(a.cuda.begin(), a.cuda.end(), [&](const auto& m) { return m.device == now.device; });
    if (then == a.cuda.end() ? now.offset != 0 : then->seed != now.seed || then->offset != now.offset) return false;
  }
  return true;
}
}  // namespace detail

}  // namespace remat
