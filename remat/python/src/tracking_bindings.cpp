// remat._C's part of remat_alloc.track: the hooks it registers on modules, optimizers and
// parameters as C++ callables (remat/tracking.hpp does the work), so that a tracked step makes no
// Python call per module, saved tensor or gradient. remat_alloc uses them where remat is imported,
// and its own Python hooks otherwise.

#include "python_bridge.hpp"

#include <remat/tracking.hpp>

#include <remat/alloc/tags.hpp>

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_hook.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>

namespace remat::python {
namespace {

alloc::NameId interned(const std::string& path) { return path.empty() ? 0 : alloc::intern_name(path); }

// Calls `fn` on each tensor in a module's arguments or output: a tensor, or tuples, lists and
// dicts of them (Hugging Face's ModelOutput is a dict), a few levels deep.
template <typename Fn>
void for_each_tensor(PyObject* value, const Fn& fn, int depth = 0) {
  if (THPVariable_Check(value)) {
    fn(THPVariable_Unpack(value));
    return;
  }
  if (depth >= 3) return;
  if (PyTuple_Check(value)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); ++i) for_each_tensor(PyTuple_GET_ITEM(value, i), fn, depth + 1);
  } else if (PyList_Check(value)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); ++i) for_each_tensor(PyList_GET_ITEM(value, i), fn, depth + 1);
  } else if (PyDict_Check(value)) {
    PyObject* key = nullptr;
    PyObject* item = nullptr;
    Py_ssize_t position = 0;
    while (PyDict_Next(value, &position, &key, &item)) for_each_tensor(item, fn, depth + 1);
  }
}

// Hooks the autograd node of each tensor in a module's output.
void hook_outputs(PyObject* value, alloc::NameId module, bool root) {
  for_each_tensor(value, [&](const at::Tensor& tensor) {
    if (const auto& node = tensor.grad_fn()) tracking::hook_backward(node, module, root);
  });
}

// A forward pre-hook (module, args[, kwargs]), or an optimizer's step pre-hook. A root's
// (registered with kwargs) also names the model's tensor arguments inputs.
struct TrackEnter {
  alloc::NameId module;
  bool root;
};

// A forward hook (module, args, output) registered with always_call, or an optimizer's step
// post-hook (with_outputs false: its third argument is not an output).
struct TrackLeave {
  alloc::NameId module;
  bool root;
  bool with_outputs;
};

// A parameter's post-accumulate-grad hook: its .grad becomes a gradient of that parameter.
struct GradientTag {
  std::shared_ptr<tracking::RetagLog> log;
  alloc::NameId module;
};

// Whether `hook` is PyTorch's dictionary of Python post-accumulate-grad hooks. libtorch_python
// exports no type_info for that class, so it is known by its (Itanium ABI) type name.
bool is_python_hooks(const torch::autograd::PostAccumulateGradHook& hook) {
  std::string_view name = typeid(hook).name();
  if (!name.empty() && name.front() == '*') name.remove_prefix(1);
  return name == "N5torch8autograd32PyFunctionTensorPostAccGradHooksE";
}

// The same, installed in C++ (hook_gradient), so that backward makes no Python call for it.
// PyTorch keeps one such hook per tensor: the one the parameter had (the dictionary behind its
// Python post-accumulate-grad hooks) is kept inside and runs first, and only while that
// dictionary holds a hook, so a step takes the GIL for none of them unless the user has some.
class GradientHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradientHook(std::shared_ptr<tracking::RetagLog> log, alloc::NameId module,
               std::unique_ptr<torch::autograd::PostAccumulateGradHook> inner)
      : log_(std::move(log)), module_(module), inner_(std::move(inner)) {
    if (inner_ && is_python_hooks(*inner_)) {
      // A dict (Python makes it an OrderedDict), held by `inner_`.
      python_dict_ = static_cast<torch::autograd::PyFunctionTensorPostAccGradHooks*>(inner_.get())->dict;
      if (python_dict_ != nullptr && !PyDict_Check(python_dict_)) python_dict_ = nullptr;  // always called then
    }
  }

  void operator()(const torch::autograd::Variable& param) override {
    if (inner_ && (python_dict_ == nullptr || python_hooks_present())) (*inner_)(param);
    log_->retag(param.grad(), alloc::Category::gradient, module_);
  }

  const tracking::RetagLog* log() const { return log_.get(); }
  std::unique_ptr<torch::autograd::PostAccumulateGradHook>& inner() { return inner_; }

 private:
  // Read without the GIL, as the engine holds none here: Python changes the dictionary only under
  // it, so at worst a hook added on another thread while this backward runs is seen next time.
  bool python_hooks_present() const {
    return __atomic_load_n(&reinterpret_cast<PyDictObject*>(python_dict_)->ma_used, __ATOMIC_RELAXED) > 0;
  }

  std::shared_ptr<tracking::RetagLog> log_;
  alloc::NameId module_;
  std::unique_ptr<torch::autograd::PostAccumulateGradHook> inner_;
  PyObject* python_dict_ = nullptr;
};

// What hook_gradient returns: remove() takes that parameter's GradientHook out of the chain (the
// hook it wrapped takes its place); nothing when the parameter is gone.
struct GradientHookHandle {
  c10::weak_intrusive_ptr<c10::TensorImpl> param;
  const tracking::RetagLog* log;

  void remove() {
    c10::intrusive_ptr<c10::TensorImpl> impl = param.lock();
    if (!impl) return;
    const at::Tensor tensor = at::Tensor(std::move(impl));
    if (torch::autograd::impl::get_autograd_meta(tensor) == nullptr) return;
    std::unique_ptr<torch::autograd::PostAccumulateGradHook>* slot = &torch::autograd::impl::post_acc_grad_hooks(tensor);
    while (auto* hook = dynamic_cast<GradientHook*>(slot->get())) {
      if (hook->log() == log) {
        std::unique_ptr<torch::autograd::PostAccumulateGradHook> inner = std::move(hook->inner());
        *slot = std::move(inner);
        break;
      }
      slot = &hook->inner();
    }
    param.reset();
  }
};

}  // namespace

void bind_tracking(py::module_& m) {
  py::class_<tracking::RetagLog, std::shared_ptr<tracking::RetagLog>>(
      m, "RetagLog", "The storages a tracking re-tagged in C++, with the tags they had before.")
      .def(py::init<>())
      .def(
          "retag",
          [](tracking::RetagLog& log, const at::Tensor& tensor, int category, const std::string& module) {
            if (category < 0 || category >= alloc::kCategoryCount) throw py::value_error("category out of range");
            return log.retag(tensor, static_cast<alloc::Category>(category), interned(module));
          },
          py::arg("tensor"), py::arg("category"), py::arg("module"))
      .def("restore", &tracking::RetagLog::restore, py::call_guard<py::gil_scoped_release>())
      .def("alive", &tracking::RetagLog::alive);

  py::class_<TrackEnter>(m, "TrackEnter", "Tracking's forward pre-hook: a temporary of the module from here.")
      .def(py::init([](const std::string& module, bool root) {
             return TrackEnter{interned(module), root};
           }),
           py::arg("module"), py::arg("root") = false)
      .def("__call__", [](const TrackEnter& self, const py::args& args, const py::kwargs&) {
        if (self.root) {
          for (std::size_t i = 1; i < args.size(); ++i) for_each_tensor(args[i].ptr(), &tracking::tag_input);
        }
        tracking::enter_module(self.module, self.root);
      });

  py::class_<TrackLeave>(m, "TrackLeave", "Tracking's forward hook: the category from before comes back.")
      .def(py::init([](const std::string& module, bool root, bool with_outputs) {
             return TrackLeave{interned(module), root, with_outputs};
           }),
           py::arg("module"), py::arg("root") = false, py::arg("with_outputs") = true)
      .def("__call__", [](const TrackLeave& self, const py::handle&, const py::handle&, const py::handle& output) {
        tracking::leave_module(self.root);
        if (self.with_outputs && !output.is_none() && at::GradMode::is_enabled()) {
          hook_outputs(output.ptr(), self.module, self.root);
        }
      });

  py::class_<GradientHookHandle>(m, "GradientHookHandle", "What hook_gradient returns: remove() takes the hook out.")
      .def("remove", &GradientHookHandle::remove);

  m.def(
      "hook_gradient",
      [](const at::Tensor& param, std::shared_ptr<tracking::RetagLog> log, const std::string& module) {
        if (!param.requires_grad() || !param.is_leaf()) {
          throw py::value_error("hook_gradient: the tensor must be a leaf that requires grad (a parameter)");
        }
        if (torch::autograd::impl::get_autograd_meta(param) == nullptr) {
          throw py::value_error("hook_gradient: the tensor has no autograd metadata");
        }
        std::unique_ptr<torch::autograd::PostAccumulateGradHook>& slot = torch::autograd::impl::post_acc_grad_hooks(param);
        const tracking::RetagLog* owner = log.get();
        slot = std::make_unique<GradientHook>(std::move(log), interned(module), std::move(slot));
        return GradientHookHandle{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()), owner};
      },
      py::arg("param"), py::arg("log"), py::arg("module"),
      "Tracking's post-accumulate-grad hook in C++: `param`'s .grad becomes a gradient of `module` as it is "
      "accumulated. Call it after the parameter's Python hooks dictionary exists (Python's own registration "
      "would replace a hook it does not know), so hooks registered later in Python still run.");

  py::class_<GradientTag>(m, "GradientTag", "Tracking's post-accumulate-grad hook: .grad is a gradient.")
      .def(py::init([](std::shared_ptr<tracking::RetagLog> log, const std::string& module) {
             return GradientTag{std::move(log), interned(module)};
           }),
           py::arg("log"), py::arg("module"))
      .def("__call__", [](const GradientTag& self, const at::Tensor& param) {
        self.log->retag(param.grad(), alloc::Category::gradient, self.module);
      });
}

}  // namespace remat::python
