// remat._C's part of remat_alloc.track: the hooks it registers on modules, optimizers and
// parameters as C++ callables (remat/tracking.hpp does the work), so that a tracked step makes no
// Python call per module, saved tensor or gradient. remat_alloc uses them where remat is imported,
// and its own Python hooks otherwise.

#include "python_bridge.hpp"

#include <remat/tracking.hpp>

#include <remat/alloc/tags.hpp>

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <string>

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
