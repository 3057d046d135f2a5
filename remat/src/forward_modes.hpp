#pragma once
// The modes that change what ops compute, as a checkpoint's forward had them: recompute runs
// under them, wherever backward runs it (torch.autocast around forward and not around
// backward is the common case).

#include <ATen/Context.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/typeid.h>

#include <array>
#include <cstddef>

namespace remat::detail {

class ForwardModes {
 public:
  // The modes in force on this thread now (and the global backend flags).
  static ForwardModes capture();

 private:
  friend class ForwardModesScope;
  struct Autocast {
    c10::DeviceType device = c10::DeviceType::CPU;
    bool enabled = false;
    at::ScalarType dtype = at::ScalarType::Undefined;
  };
  void apply() const;
  bool any_autocast() const;

  static constexpr std::size_t kMaxAutocastDevices = 8;
  std::array<Autocast, kMaxAutocastDevices> autocast_{};  // per device type that has autocast
  std::size_t autocast_devices_ = 0;
  bool autocast_cache_ = true;
  caffe2::TypeMeta default_dtype_;
  // Global flags a context manager sets (torch.backends.*.flags, sdpa_kernel,
  // use_deterministic_algorithms).
  bool deterministic_ = false;
  bool deterministic_warn_only_ = false;
  bool cudnn_enabled_ = true;
  bool cudnn_benchmark_ = false;
  bool cudnn_deterministic_ = false;
  bool flash_sdp_ = true;
  bool mem_efficient_sdp_ = true;
  bool math_sdp_ = true;
  bool cudnn_sdp_ = true;
};

// Sets `modes` for a scope and puts back what was there.
class ForwardModesScope {
 public:
  explicit ForwardModesScope(const ForwardModes& modes);
  ~ForwardModesScope();
  ForwardModesScope(const ForwardModesScope&) = delete;
  ForwardModesScope& operator=(const ForwardModesScope&) = delete;

 private:
  ForwardModes outer_;
  bool autocast_ = false;  // entered an autocast nesting level
};

}  // namespace remat::detail
