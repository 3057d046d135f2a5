#include "forward_modes.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>

#include <array>

namespace remat::detail {
namespace {

constexpr std::array<c10::DeviceType, 7> kAutocastDevices = {c10::DeviceType::CPU, c10::DeviceType::CUDA, c10::DeviceType::XPU,
                                         c10::DeviceType::MPS, c10::DeviceType::HPU,  c10::DeviceType::XLA,
                                         c10::DeviceType::PrivateUse1};

// Modes and flags are set only where they differ: a recompute under the modes forward had (the
// common case) writes nothing, and no other thread sees a global flag written.
template <typename Value, typename Get, typename Set>
void set_if_different(Value wanted, Get get, Set set) {
  if (get() != wanted) set(wanted);
}

}  // namespace

ForwardModes ForwardModes::capture() {
  ForwardModes modes;
  for (const c10::DeviceType device : kAutocastDevices) {
    if (!at::autocast::is_autocast_available(device)) continue;
    modes.autocast_[modes.autocast_devices_++] = {device, at::autocast::is_autocast_enabled(device),
                                                  at::autocast::get_autocast_dtype(device)};
  }
  modes.autocast_cache_ = at::autocast::is_autocast_cache_enabled();
  modes.default_dtype_ = c10::get_default_dtype();
  const at::Context& context = at::globalContext();
  modes.deterministic_ = context.deterministicAlgorithms();
  modes.deterministic_warn_only_ = context.deterministicAlgorithmsWarnOnly();
  modes.cudnn_enabled_ = context.userEnabledCuDNN();
  modes.cudnn_benchmark_ = context.benchmarkCuDNN();
  modes.cudnn_deterministic_ = context.deterministicCuDNN();
  modes.flash_sdp_ = context.userEnabledFlashSDP();
  modes.mem_efficient_sdp_ = context.userEnabledMemEfficientSDP();
  modes.math_sdp_ = context.userEnabledMathSDP();
  modes.cudnn_sdp_ = context.userEnabledCuDNNSDP();
  return modes;
}

bool ForwardModes::any_autocast() const {
  for (std::size_t i = 0; i < autocast_devices_; ++i) {
    if (autocast_[i].enabled) return true;
  }
  return false;
}

void ForwardModes::apply() const {
  for (std::size_t i = 0; i < autocast_devices_; ++i) {
    const c10::DeviceType device = autocast_[i].device;
    set_if_different(
        autocast_[i].enabled, [&] { return at::autocast::is_autocast_enabled(device); },
        [&](bool b) { at::autocast::set_autocast_enabled(device, b); });
    set_if_different(
        autocast_[i].dtype, [&] { return at::autocast::get_autocast_dtype(device); },
        [&](at::ScalarType t) { at::autocast::set_autocast_dtype(device, t); });
  }
  set_if_different(
      autocast_cache_, [] { return at::autocast::is_autocast_cache_enabled(); },
      [](bool b) { at::autocast::set_autocast_cache_enabled(b); });
  if (c10::get_default_dtype() != default_dtype_) c10::set_default_dtype(default_dtype_);
  at::Context& context = at::globalContext();
  if (context.deterministicAlgorithms() != deterministic_ ||
      context.deterministicAlgorithmsWarnOnly() != deterministic_warn_only_) {
    context.setDeterministicAlgorithms(deterministic_, deterministic_warn_only_);
  }
  set_if_different(cudnn_enabled_, [&] { return context.userEnabledCuDNN(); }, [&](bool b) { context.setUserEnabledCuDNN(b); });
  set_if_different(cudnn_benchmark_, [&] { return context.benchmarkCuDNN(); }, [&](bool b) { context.setBenchmarkCuDNN(b); });
  set_if_different(cudnn_deterministic_, [&] { return context.deterministicCuDNN(); },
                   [&](bool b) { context.setDeterministicCuDNN(b); });
  set_if_different(flash_sdp_, [&] { return context.userEnabledFlashSDP(); }, [&](bool b) { context.setSDPUseFlash(b); });
  set_if_different(mem_efficient_sdp_, [&] { return context.userEnabledMemEfficientSDP(); },
                   [&](bool b) { context.setSDPUseMemEfficient(b); });
  set_if_different(math_sdp_, [&] { return context.userEnabledMathSDP(); }, [&](bool b) { context.setSDPUseMath(b); });
  set_if_different(cudnn_sdp_, [&] { return context.userEnabledCuDNNSDP(); }, [&](bool b) { context.setSDPUseCuDNN(b); });
}

ForwardModesScope::ForwardModesScope(const ForwardModes& modes) : outer_(ForwardModes::capture()) {
  modes.apply();
  // As torch.autocast does on entry: casts cached inside are dropped when the outermost
  // autocast level exits, so recompute's casts of parameters do not outlive it.
  if (modes.any_autocast()) {
    at::autocast::increment_nesting();
    autocast_ = true;
  }
}

ForwardModesScope::~ForwardModesScope() {
  if (autocast_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  outer_.apply();
}

}  // namespace remat::detail
