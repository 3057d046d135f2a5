// remat._C.SavedTensorHooks: a Python pack/unpack pair (with an optional capture_context) as the
// runtime's SavedTensorHooks; remat._C.CpuOffload, the runtime's own offloader as a pair; the
// thread's scope of a pair, and the info a pack hook reads.

#include "python_bridge.hpp"

#include <remat/cpu_offload.hpp>
#include <remat/saved_tensor_hooks.hpp>

#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <string>

namespace remat::python {
namespace {

class PythonSavedTensorHooks final : public SavedTensorHooks {
 public:
  PythonSavedTensorHooks(py::object pack, py::object unpack, py::object capture_context)
      : pack_(std::move(pack)), unpack_(std::move(unpack)), captures_(!capture_context.is_none()),
        capture_context_(std::move(capture_context)) {}

  std::any capture_context() override {
    return with_gil([&] { return PyRef(capture_context_.get()()); });
  }
  bool captures_context() const override { return captures_; }

  std::any pack(const at::Tensor& tensor) override {
    return with_gil([&] { return PyRef(pack_.get()(tensor)); });
  }

  at::Tensor unpack(const std::any& payload) override {
    return with_gil([&] {
      const py::object tensor = unpack_.get()(std::any_cast<const PyRef&>(payload).get());
      if (!THPVariable_Check(tensor.ptr())) {
        throw py::type_error("saved_tensors_hooks: the unpack hook returned " +
                             py::str(py::type::handle_of(tensor).attr("__name__")).cast<std::string>() +
                             "; it must return the Tensor its pack hook was given (or an equal copy)");
      }
      return THPVariable_Unpack(tensor.ptr());
    });
  }

  const py::object& unpack_hook() const { return unpack_.get(); }

 private:
  PyRef pack_;
  PyRef unpack_;
  bool captures_;
  PyRef capture_context_;
};

void check_callable(const py::object& hook, const char* parameter) {
  if (!PyCallable_Check(hook.ptr())) {
    throw py::type_error(std::string("saved_tensors_hooks: ") + parameter + " must be callable, got " +
                         py::str(py::type::handle_of(hook).attr("__name__")).cast<std::string>());
  }
}

// The pair as the thread's innermost, for a with block (entered and exited on one thread).
struct HooksScope {
  explicit HooksScope(std::shared_ptr<SavedTensorHooks> pair) : hooks(std::move(pair)) {}
  std::shared_ptr<SavedTensorHooks> hooks;
  std::optional<SavedTensorHooksScope> scope;
};

}  // namespace

std::shared_ptr<SavedTensorHooks> saved_tensor_hooks_of(const py::handle& hooks) {
  if (hooks.is_none()) return nullptr;
  return hooks.cast<std::shared_ptr<SavedTensorHooks>>();
}

namespace {

// What CpuOffload.pack hands Python in place of a tensor.
struct OffloadPayload {
  std::any payload;
};

py::dict stats_dict(const CpuOffloadStats& stats) {
  py::dict reasons;
  for (const auto& [reason, count] : stats.kept_resident_reasons) reasons[py::str(reason)] = count;
  py::dict out;
  out["offloaded_bytes"] = stats.offloaded_bytes;
  out["offloaded_tensors"] = stats.offloaded_tensors;
  out["shared_tensors"] = stats.shared_tensors;
  out["kept_resident_bytes"] = stats.kept_resident_bytes;
  out["kept_resident_tensors"] = stats.kept_resident_tensors;
  out["kept_resident_reasons"] = reasons;
  out["resident_host_bytes"] = stats.resident_host_bytes;
  out["peak_host_bytes"] = stats.peak_host_bytes;
  out["inflight_bytes"] = stats.inflight_bytes;
  out["prefetch_hits"] = stats.prefetch_hits;
  out["prefetch_misses"] = stats.prefetch_misses;
  out["wait_bytes"] = stats.wait_bytes;
  out["wait_seconds"] = stats.wait_seconds;
  return out;
}

void bind_cpu_offload(py::module_& m) {
  py::class_<OffloadPayload>(m, "OffloadPayload", "A tensor as CpuOffload holds it (on the host, or as it was).");
  const auto pack = [](CpuOffload& offload, const at::Tensor& tensor) {
    // PyTorch's own saves outside checkpoints: kind BACKWARD, no context.
    return OffloadPayload{run_pack(offload, tensor, SavedTensorInfo{})};
  };
  py::class_<CpuOffload, SavedTensorHooks, std::shared_ptr<CpuOffload>>(
      m, "CpuOffload", "remat::CpuOffload: what checkpoints keep, held in pinned host memory (remat.CpuOffload).")
      .def(py::init([](std::uint64_t prefetch, std::optional<std::uint64_t> max_inflight_bytes, std::uint64_t min_bytes) {
             return std::make_shared<CpuOffload>(CpuOffloadOptions{prefetch, max_inflight_bytes, min_bytes});
           }),
           py::arg("prefetch"), py::arg("max_inflight_bytes"), py::arg("min_bytes"))
      .def("pack", pack, py::arg("tensor"), py::call_guard<py::gil_scoped_release>())
      .def("native_pack", pack, py::arg("tensor"), py::call_guard<py::gil_scoped_release>())
      .def(
          "unpack", [](CpuOffload& offload, const OffloadPayload& payload) { return offload.unpack(payload.payload); },
          py::arg("payload"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("unpack_hook", [](py::object self) { return self.attr("unpack"); })
      .def("stats", [](const CpuOffload& offload) { return stats_dict(offload.stats()); });
}

}  // namespace

void bind_saved_tensor_hooks(py::module_& m) {
  py::class_<SavedTensorHooks, std::shared_ptr<SavedTensorHooks>>(m, "SavedTensorHooksBase",
                                                                  "What every pair the runtime takes is.");
  py::class_<PythonSavedTensorHooks, SavedTensorHooks, std::shared_ptr<PythonSavedTensorHooks>>(
      m, "SavedTensorHooks", "A pack/unpack pair for what checkpoints keep (remat.saved_tensors_hooks).")
      .def(py::init([](py::object pack, py::object unpack, py::object capture_context) {
             check_callable(pack, "pack_hook");
             check_callable(unpack, "unpack_hook");
             if (!capture_context.is_none()) check_callable(capture_context, "capture_context");
             return std::make_shared<PythonSavedTensorHooks>(std::move(pack), std::move(unpack),
                                                              std::move(capture_context));
           }),
           py::arg("pack_hook"), py::arg("unpack_hook"), py::arg("capture_context") = py::none())
      .def(
          "native_pack",
          [](PythonSavedTensorHooks& hooks, const at::Tensor& tensor) {
            // PyTorch's own saves outside checkpoints: kind BACKWARD, no context.
            std::any payload = run_pack(hooks, tensor, SavedTensorInfo{});
            return std::any_cast<const PyRef&>(payload).get();
          },
          py::arg("tensor"), "The pack hook as PyTorch's saved_tensors_hooks calls it, outside checkpoints.")
      .def_property_readonly("unpack_hook", &PythonSavedTensorHooks::unpack_hook);

  py::class_<HooksScope>(m, "SavedTensorHooksScope", "Makes a pair the thread's innermost for a with block.")
      .def(py::init<std::shared_ptr<SavedTensorHooks>>(), py::arg("hooks"))
      .def("__enter__", [](HooksScope& self) { self.scope.emplace(self.hooks); })
      .def("__exit__", [](HooksScope& self, const py::args&) { self.scope.reset(); });

  bind_cpu_offload(m);

  m.def("saved_tensor_hooks_active", [] { return active_saved_tensor_hooks() != nullptr; },
        "Whether a remat pair is in force on this thread.");
  m.def(
      "current_saved_tensor_info",
      [] {
        const SavedTensorInfo& info = current_saved_tensor_info();
        const auto* context = info.context != nullptr ? std::any_cast<PyRef>(info.context) : nullptr;
        return py::make_tuple(to_string(info.kind), context != nullptr ? context->get() : py::none());
      },
      "(kind name, captured context) of the pack running on this thread.");
}

}  // namespace remat::python
