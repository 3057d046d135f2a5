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

#include <cstddef>
#include <exception>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

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
void hook_outputs(PyObject* value, alloc::NameId module) {
  for_each_tensor(value, [&](const at::Tensor& tensor) {
    if (const auto& node = tensor.grad_fn()) tracking::hook_backward(node, module);
  });
}

// TrackEnter and TrackLeave are plain CPython types called through vectorcall: a module's hooks run
// at every call of every tracked module, and pybind11's dispatch (argument tuples, overload
// matching) cost several times what the hooks themselves do.
struct TrackHookObject {
  PyObject ob_base;  // PyObject_HEAD
  vectorcallfunc vectorcall;
  alloc::NameId module;
  bool root;
  bool with_outputs;
};

// Runs `fn`, turning a C++ exception into a Python one; nullptr then, Py_None otherwise.
template <typename Fn>
PyObject* python_call(const Fn& fn) {
  try {
    fn();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// A forward pre-hook (module, args[, kwargs]), or an optimizer's step pre-hook. A root's
// (registered with kwargs) also names the model's tensor arguments inputs.
PyObject* track_enter(PyObject* callable, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  const auto* self = reinterpret_cast<const TrackHookObject*>(callable);
  const Py_ssize_t count = PyVectorcall_NARGS(nargsf) + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  return python_call([&] {
    if (self->root) {
      for (Py_ssize_t i = 1; i < count; ++i) for_each_tensor(args[i], &tracking::tag_input);
    }
    tracking::enter_module(self->module, self->root);
  });
}

// A forward hook (module, args, output) registered with always_call, or an optimizer's step
// post-hook (with_outputs false: its third argument is not an output).
PyObject* track_leave(PyObject* callable, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  const auto* self = reinterpret_cast<const TrackHookObject*>(callable);
  const Py_ssize_t count = PyVectorcall_NARGS(nargsf) + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  if (count != 3) {
    PyErr_Format(PyExc_TypeError, "TrackLeave takes 3 arguments (module, args, output), got %zd", count);
    return nullptr;
  }
  return python_call([&] {
    tracking::leave_module(self->root);
    PyObject* output = args[2];
    if (self->with_outputs && output != Py_None && at::GradMode::is_enabled()) {
      hook_outputs(output, self->module);
    }
  });
}

// `path` (a str or bytes module path) interned into `*module`; false with a Python error set.
bool path_id(PyObject* path, const char* type_name, alloc::NameId* module) {
  const char* text = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_Check(path)) {
    text = PyBytes_AS_STRING(path);
    size = PyBytes_GET_SIZE(path);
  } else if (PyUnicode_Check(path)) {
    text = PyUnicode_AsUTF8AndSize(path, &size);
    if (text == nullptr) return false;
  } else {
    PyErr_Format(PyExc_TypeError, "%s: module must be a str or bytes path, got %s", type_name, Py_TYPE(path)->tp_name);
    return false;
  }
  try {
    *module = interned(std::string(text, static_cast<std::size_t>(size)));
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_ValueError, error.what());
    return false;
  }
  return true;
}

// TrackEnter(module, root=False) and TrackLeave(module, root=False, with_outputs=True); module is
// the path (str or bytes).
template <bool kLeave>
PyObject* new_track_hook(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* leave_keywords[] = {"module", "root", "with_outputs", nullptr};
  static const char* enter_keywords[] = {"module", "root", nullptr};
  PyObject* path = nullptr;
  int root = 0;
  int with_outputs = 1;
  const bool parsed =
      kLeave ? PyArg_ParseTupleAndKeywords(args, kwargs, "O|pp", const_cast<char**>(leave_keywords), &path, &root,
                                           &with_outputs)
             : PyArg_ParseTupleAndKeywords(args, kwargs, "O|p", const_cast<char**>(enter_keywords), &path, &root);
  if (!parsed) return nullptr;
  alloc::NameId module = 0;
  if (!path_id(path, type->tp_name, &module)) return nullptr;
  auto* self = reinterpret_cast<TrackHookObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = kLeave ? &track_leave : &track_enter;
  self->module = module;
  self->root = root != 0;
  self->with_outputs = with_outputs != 0;
  return reinterpret_cast<PyObject*>(self);
}

// TrackCall(module, path, root=False): set as a module's `_compiled_call_impl`, which
// Module.__call__ calls instead of `_call_impl` when set. It does what TrackEnter and TrackLeave do
// around the module's own `_call_impl`, so a module tracked this way has no hooks and PyTorch
// calls it by its path without hooks: the slow path that runs a module's hooks costs more than
// the hooks. Holds the module weakly (the module's __dict__ holds it), so no cycle is made.
struct TrackCallObject {
  PyObject ob_base;  // PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* module_ref;  // a weak reference to the module
  alloc::NameId module;
  bool root;
};

PyObject* call_impl_name() {
  static PyObject* name = PyUnicode_InternFromString("_call_impl");
  return name;
}

PyObject* track_call(PyObject* callable, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  const auto* self = reinterpret_cast<const TrackCallObject*>(callable);
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* module = nullptr;  // a new reference, or none when the module is gone
  if (PyWeakref_GetRef(self->module_ref, &module) < 0) return nullptr;
#else
  PyObject* module = PyWeakref_GetObject(self->module_ref);  // borrowed
  if (module == nullptr) return nullptr;
  if (module == Py_None) module = nullptr;
  Py_XINCREF(module);
#endif
  if (module == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "TrackCall: the module it tracks is gone");
    return nullptr;
  }
  const Py_ssize_t positional = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t count = positional + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  PyObject* entered = python_call([&] {
    if (self->root) {
      // Depth 1, as each argument is inside the args tuple or kwargs dict a forward pre-hook gets.
      for (Py_ssize_t i = 0; i < count; ++i) for_each_tensor(args[i], &tracking::tag_input, 1);
    }
    tracking::enter_module(self->module, self->root);
  });
  if (entered == nullptr) {
    Py_DECREF(module);
    return nullptr;
  }
  Py_DECREF(entered);
  // The module first, then the arguments as they came.
  PyObject* small[8];
  std::vector<PyObject*> large;
  PyObject** with_self = small;
  if (count + 1 > static_cast<Py_ssize_t>(std::size(small))) {
    large.resize(static_cast<std::size_t>(count) + 1);
    with_self = large.data();
  }
  with_self[0] = module;
  for (Py_ssize_t i = 0; i < count; ++i) with_self[i + 1] = args[i];
  PyObject* output =
      PyObject_VectorcallMethod(call_impl_name(), with_self, static_cast<std::size_t>(positional) + 1, kwnames);
  Py_DECREF(module);
  // Always, as a forward hook with always_call: the category from before comes back.
  PyObject* left = python_call([&] {
    tracking::leave_module(self->root);
    if (output != nullptr && output != Py_None && at::GradMode::is_enabled()) {
      hook_outputs(output, self->module);
    }
  });
  if (left == nullptr) {
    Py_XDECREF(output);
    return nullptr;
  }
  Py_DECREF(left);
  return output;
}

// A TrackCall of `target` (held weakly) under the module path `module`.
PyObject* make_track_call(PyTypeObject* type, PyObject* target, alloc::NameId module, bool root) {
  PyObject* ref = PyWeakref_NewRef(target, nullptr);
  if (ref == nullptr) return nullptr;
  auto* self = reinterpret_cast<TrackCallObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    Py_DECREF(ref);
    return nullptr;
  }
  self->vectorcall = &track_call;
  self->module_ref = ref;
  self->module = module;
  self->root = root;
  return reinterpret_cast<PyObject*>(self);
}

PyObject* new_track_call(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"module", "path", "root", nullptr};
  PyObject* target = nullptr;
  PyObject* path = nullptr;
  int root = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|p", const_cast<char**>(keywords), &target, &path, &root)) {
    return nullptr;
  }
  alloc::NameId module = 0;
  if (!path_id(path, type->tp_name, &module)) return nullptr;
  return make_track_call(type, target, module, root != 0);
}

// TrackCall.for_module(module): the same call (module path, root or not) for another module. A
// module copied with its __dict__ as it is (nn.DataParallel's replicas) holds the original's
// TrackCall, which would run the original module: the copy takes one of its own.
PyObject* track_call_for_module(PyObject* callable, PyObject* target) {
  const auto* self = reinterpret_cast<const TrackCallObject*>(callable);
  return make_track_call(Py_TYPE(callable), target, self->module, self->root);
}

PyMethodDef track_call_methods[] = {
    {"for_module", &track_call_for_module, METH_O,
     "The same call (module path, root or not) for another module: a copy of the module that took its __dict__."},
    {nullptr, nullptr, 0, nullptr}};

void dealloc_track_call(PyObject* object) {
  Py_CLEAR(reinterpret_cast<TrackCallObject*>(object)->module_ref);
  Py_TYPE(object)->tp_free(object);
}

PyTypeObject make_track_call_type() {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "remat._C.TrackCall";
  type.tp_basicsize = sizeof(TrackCallObject);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  type.tp_doc = "Tracking's call of a module (its _compiled_call_impl): enter, the module's _call_impl, leave.";
  type.tp_new = &new_track_call;
  type.tp_dealloc = &dealloc_track_call;
  type.tp_methods = track_call_methods;
  type.tp_call = PyVectorcall_Call;
  type.tp_vectorcall_offset = offsetof(TrackCallObject, vectorcall);
  return type;
}

PyTypeObject track_call_type = make_track_call_type();

PyTypeObject track_hook_type(const char* name, const char* doc, newfunc make) {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = name;
  type.tp_basicsize = sizeof(TrackHookObject);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  type.tp_doc = doc;
  type.tp_new = make;
  type.tp_call = PyVectorcall_Call;
  type.tp_vectorcall_offset = offsetof(TrackHookObject, vectorcall);
  return type;
}

PyTypeObject track_enter_type = track_hook_type(
    "remat._C.TrackEnter", "Tracking's forward pre-hook: a temporary of the module from here.", &new_track_hook<false>);
PyTypeObject track_leave_type = track_hook_type(
    "remat._C.TrackLeave", "Tracking's forward hook: the category from before comes back.", &new_track_hook<true>);

void add_type(py::module_& m, const char* name, PyTypeObject& type) {
  if (PyType_Ready(&type) < 0) throw py::error_already_set();
  Py_INCREF(&type);
  if (PyModule_AddObject(m.ptr(), name, reinterpret_cast<PyObject*>(&type)) < 0) {
    Py_DECREF(&type);
    throw py::error_already_set();
  }
}

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

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    tracking::refuse_compiled_autograd();
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
    std::unique_ptr<torch::autograd::PostAccumulateGradHook>* slot =
        &torch::autograd::impl::post_acc_grad_hooks(tensor);
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

  py::class_<tracking::ActiveTracking>(m, "ActiveTracking",
                                       "Held by a tracking while it is active: end() when it ends (untrack).")
      .def(py::init<>())
      .def("end", &tracking::ActiveTracking::end);

  add_type(m, "TrackEnter", track_enter_type);
  add_type(m, "TrackLeave", track_leave_type);
  add_type(m, "TrackCall", track_call_type);

  py::class_<GradientHookHandle>(m, "GradientHookHandle", "What hook_gradient returns: remove() takes the hook out.")
      .def("remove", &GradientHookHandle::remove);

  m.def(
      "hook_gradient",
      [](const at::Tensor& param, std::shared_ptr<tracking::RetagLog> log, const std::string& module) {
        if (!param.is_leaf()) throw py::value_error("hook_gradient: the tensor must be a leaf (a parameter)");
        // A frozen parameter takes it too (its metadata made here), for when it is unfrozen
        torch::autograd::impl::materialize_autograd_meta(param);
        std::unique_ptr<torch::autograd::PostAccumulateGradHook>& slot =
            torch::autograd::impl::post_acc_grad_hooks(param);
        const tracking::RetagLog* owner = log.get();
        slot = std::make_unique<GradientHook>(std::move(log), interned(module), std::move(slot));
        return GradientHookHandle{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()), owner};
      },
      py::arg("param"), py::arg("log"), py::arg("module"),
      "Tracking's post-accumulate-grad hook in C++: `param`'s .grad becomes a gradient of `module` as it is "
      "accumulated (a frozen parameter's once it is unfrozen). Call it after the parameter's Python hooks dictionary "
      "exists (Python's own registration "
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
