#include "held_tensors.hpp"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_set>

namespace remat::python {
namespace py = pybind11;

namespace {

// Closures of closures: a plan's wrapper around a lambda around another around a layer is four.
constexpr int kClosureDepth = 4;

// Held for the process's lifetime.
const py::handle& module_type() {
  static const py::handle type = py::module_::import("torch.nn").attr("Module").cast<py::object>().release();
  return type;
}

// Batch and instance norm's base class.
const py::handle& norm_type() {
  static const py::handle type =
      py::module_::import("torch.nn.modules.batchnorm").attr("_NormBase").cast<py::object>().release();
  return type;
}

const py::handle& partial_type() {
  static const py::handle type = py::module_::import("functools").attr("partial").cast<py::object>().release();
  return type;
}

// A container in a closure or a global holds no more than this many values that are looked at.
constexpr Py_ssize_t kContainerItems = 256;

// A buffer's entry in its module's `_buffers` (where nn.Module keeps it: `module.name = tensor`
// assigns there). Holds the dict and the name; drops them with the GIL held, on any thread.
class ModuleBufferSlot final : public BufferSlot {
 public:
  ModuleBufferSlot(PyObject* buffers, PyObject* name) : buffers_(buffers), name_(name) {
    Py_INCREF(buffers_);
    Py_INCREF(name_);
  }
  ~ModuleBufferSlot() override {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release
    py::gil_scoped_acquire gil;
    Py_DECREF(buffers_);
    Py_DECREF(name_);
  }
  ModuleBufferSlot(const ModuleBufferSlot&) = delete;
  ModuleBufferSlot& operator=(const ModuleBufferSlot&) = delete;

  std::optional<at::Tensor> held() const override {
    py::gil_scoped_acquire gil;
    PyObject* value = PyDict_GetItem(buffers_, name_);
    if (value == nullptr) return std::nullopt;
    return THPVariable_Check(value) ? THPVariable_Unpack(value) : at::Tensor();
  }

  void hold(const std::optional<at::Tensor>& held) override {
    py::gil_scoped_acquire gil;
    if (!held) {  // no such buffer: the entry taken out, where there is one
      if (PyDict_GetItem(buffers_, name_) != nullptr && PyDict_DelItem(buffers_, name_) != 0) {
        throw py::error_already_set();
      }
      return;
    }
    const py::object value = held->defined() ? py::reinterpret_steal<py::object>(THPVariable_Wrap(*held)) : py::none();
    if (!value || PyDict_SetItem(buffers_, name_, value.ptr()) != 0) throw py::error_already_set();
  }

 private:
  PyObject* buffers_;
  PyObject* name_;
};

class Walk {
 public:
  // What is gathered: the parameters and buffers (norm layers' running statistics left out while
  // they train) into `tensors`, or the buffers and parameters, with their modules' modes, into
  // `buffers` (what forward may change in place).
  explicit Walk(bool as_held_buffers) : as_held_buffers_(as_held_buffers) {}
  TensorList tensors;
  std::vector<HeldBuffer> buffers;

  // Walks what `object` reaches, `depth` closures below the body's function.
  void reach(const py::handle& object, int depth) {
    if (object.ptr() == nullptr || depth > kClosureDepth || !seen_.insert(object.ptr()).second) return;
    PyObject* raw = object.ptr();
    if (PyObject_IsInstance(raw, module_type().ptr()) == 1) {
      module(object);
    } else if (PyMethod_Check(raw)) {
      reach(PyMethod_GET_SELF(raw), depth);
      reach(PyMethod_GET_FUNCTION(raw), depth);
    } else if (PyFunction_Check(raw)) {
      function(raw, depth);
    } else if (PyObject_IsInstance(raw, partial_type().ptr()) == 1) {
      reach(object.attr("func"), depth + 1);
      for (const py::handle arg : object.attr("args")) reach(arg, depth + 1);
      arguments_of(object.attr("keywords").ptr());
    } else if (depth > 0 && (PyList_Check(raw) || PyTuple_Check(raw) || PyDict_Check(raw))) {
      argument(raw);  // layers kept in a plain list
    } else if (Py_TYPE(raw)->tp_dictoffset != 0 && !THPVariable_Check(raw)) {
      // Another object with attributes: a callable one, or one whose method is the function (a
      // trainer's step).
      if (PyObject* attributes = PyObject_GenericGetDict(raw, nullptr)) {
        arguments_of(attributes);
        Py_DECREF(attributes);
      }
    }
    PyErr_Clear();  // an isinstance check that raised (a proxy object) is a value that holds nothing here
  }

  // The modules among a dict's values.
  void values_of(PyObject* dict) {
    if (!PyDict_Check(dict)) return;
    Py_ssize_t position = 0, looked_at = 0;
    PyObject* value = nullptr;
    while (looked_at++ < kContainerItems && PyDict_Next(dict, &position, nullptr, &value)) modules_only(value);
  }

  // The modules among a dict's values, or among the items of a list, tuple or dict there (an
  // object's attributes: a trainer holding its layers in a list; a partial's keywords).
  void arguments_of(PyObject* dict) {
    if (!PyDict_Check(dict)) return;
    Py_ssize_t position = 0, looked_at = 0;
    PyObject* value = nullptr;
    while (looked_at++ < kContainerItems && PyDict_Next(dict, &position, nullptr, &value)) argument(value);
  }

  // A module, or the modules among the items of a list, tuple or dict (a call's argument, a value
  // in a closure).
  void argument(PyObject* value) {
    if (PyList_Check(value) || PyTuple_Check(value)) {
      const Py_ssize_t size = std::min(PySequence_Fast_GET_SIZE(value), kContainerItems);
      for (Py_ssize_t i = 0; i < size; ++i) modules_only(PySequence_Fast_GET_ITEM(value, i));
    } else if (PyDict_Check(value)) {
      values_of(value);
    } else {
      modules_only(value);
    }
  }

  void modules_only(PyObject* value) {
    if (PyObject_IsInstance(value, module_type().ptr()) == 1 && seen_.insert(value).second) module(value);
  }

 private:
  // What the function's closure holds, the modules among its defaults, and those among the globals
  // its code names, or in a list, tuple or dict there (a model defined at a script's top level).
  void function(PyObject* raw, int depth) {
    PyObject* closure = PyFunction_GET_CLOSURE(raw);
    if (closure != nullptr && PyTuple_Check(closure)) {
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(closure); ++i) {
        PyObject* cell = PyTuple_GET_ITEM(closure, i);
        if (PyCell_Check(cell) && PyCell_GET(cell) != nullptr) reach(PyCell_GET(cell), depth + 1);
      }
    }
    // Modules bound as defaults (`def block(t, lin=lin)` in a loop)
    PyObject* defaults = PyFunction_GET_DEFAULTS(raw);
    if (defaults != nullptr && PyTuple_Check(defaults)) {
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(defaults); ++i) modules_only(PyTuple_GET_ITEM(defaults, i));
    }
    if (PyObject* keyword_defaults = PyFunction_GET_KW_DEFAULTS(raw)) values_of(keyword_defaults);
    PyObject* globals = PyFunction_GET_GLOBALS(raw);
    const py::object names = py::getattr(PyFunction_GET_CODE(raw), "co_names", py::none());
    if (globals == nullptr || !PyDict_Check(globals) || !PyTuple_Check(names.ptr())) return;
    for (const py::handle name : names) {
      if (PyObject* value = PyDict_GetItem(globals, name.ptr())) argument(value);
    }
  }

  // A module's tensors and its children's, read from the instance dicts (where nn.Module keeps
  // them) with interned names: a model reached whole is walked at every recompute.
  void module(const py::handle& object) {
    const Names& names = Names::get();
    const py::object attributes = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(object.ptr(), nullptr));
    if (!attributes || !PyDict_Check(attributes.ptr())) {
      PyErr_Clear();
      return;
    }
    const bool training = PyDict_GetItem(attributes.ptr(), names.training) == Py_True;
    const bool norm_training = training && PyObject_IsInstance(object.ptr(), norm_type().ptr()) == 1;
    if (as_held_buffers_) {
      held_buffers_of(attributes.ptr(), training, norm_training);
    } else {
      tensors_of(attributes.ptr(), norm_training);
    }
    PyObject* children = PyDict_GetItem(attributes.ptr(), names.modules);
    if (children == nullptr || !PyDict_Check(children)) return;
    Py_ssize_t position = 0;
    PyObject* child = nullptr;
    while (PyDict_Next(children, &position, nullptr, &child)) {
      if (child != Py_None && seen_.insert(child).second) module(child);
    }
  }

  void held_buffers_of(PyObject* attributes, bool training, bool norm_training) {
    const Names& names = Names::get();
    PyObject* own = PyDict_GetItem(attributes, names.buffers);
    if (own == nullptr || !PyDict_Check(own)) return;
    // A norm layer changes its running statistics while it trains without moving their version
    // counters, as it adds to num_batches_tracked
    PyObject* count = norm_training ? PyDict_GetItem(own, names.num_batches_tracked) : nullptr;
    const at::Tensor counted = count != nullptr && THPVariable_Check(count) ? THPVariable_Unpack(count) : at::Tensor();
    Py_ssize_t position = 0;
    PyObject *name = nullptr, *value = nullptr;
    while (PyDict_Next(own, &position, &name, &value)) {
      if (!THPVariable_Check(value)) continue;
      const char* text = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
      buffers.push_back({THPVariable_Unpack(value), training, text != nullptr ? text : "?",
                         norm_training && running_statistics(name) ? counted : at::Tensor(),
                         std::make_shared<ModuleBufferSlot>(own, name)});
    }
    // Parameters too: a body may change one in place under no_grad (a momentum encoder's update)
    PyObject* parameters = PyDict_GetItem(attributes, names.parameters);
    position = 0;
    while (parameters != nullptr && PyDict_Check(parameters) && PyDict_Next(parameters, &position, &name, &value)) {
      if (!THPVariable_Check(value)) continue;
      const at::Tensor& parameter = THPVariable_Unpack(value);
      if (parameter.numel() == 0) continue;  // a lazy module's, made in its first forward
      const char* text = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
      HeldBuffer& held = buffers.emplace_back();
      held.tensor = parameter;
      held.training = training;
      held.name = text != nullptr ? text : "?";
      held.parameter = true;
    }
    PyErr_Clear();
  }

  void tensors_of(PyObject* attributes, bool norm_training) {
    const Names& names = Names::get();
    for (PyObject* members : {names.parameters, names.buffers}) {
      PyObject* own = PyDict_GetItem(attributes, members);
      if (own == nullptr || !PyDict_Check(own)) continue;
      Py_ssize_t position = 0;
      PyObject *name = nullptr, *value = nullptr;
      while (PyDict_Next(own, &position, &name, &value)) {
        if (!THPVariable_Check(value)) continue;
        if (norm_training && running_statistics(name)) continue;
        tensors.push_back(THPVariable_Unpack(value));
      }
    }
  }

  static bool running_statistics(PyObject* name) {
    const Names& names = Names::get();
    return PyUnicode_Compare(name, names.running_mean) == 0 || PyUnicode_Compare(name, names.running_var) == 0;
  }

  // Interned attribute names, made once (process lifetime).
  struct Names {
    PyObject* parameters = PyUnicode_InternFromString("_parameters");
    PyObject* buffers = PyUnicode_InternFromString("_buffers");
    PyObject* modules = PyUnicode_InternFromString("_modules");
    PyObject* training = PyUnicode_InternFromString("training");
    PyObject* running_mean = PyUnicode_InternFromString("running_mean");
    PyObject* running_var = PyUnicode_InternFromString("running_var");
    PyObject* num_batches_tracked = PyUnicode_InternFromString("num_batches_tracked");
    static const Names& get() {
      static const Names names;
      return names;
    }
  };

  bool as_held_buffers_;
  std::unordered_set<PyObject*> seen_;
};

Walk walk_from(const py::handle& fn, const py::tuple& args_and_kwargs, bool as_held_buffers) {
  Walk walk(as_held_buffers);
  walk.reach(fn, 0);
  for (const py::handle arg : args_and_kwargs[0]) walk.argument(arg.ptr());
  walk.arguments_of(args_and_kwargs[1].ptr());
  PyErr_Clear();
  return walk;
}

}  // namespace

TensorList tensors_held(const py::handle& fn, const py::tuple& args_and_kwargs) {
  return std::move(walk_from(fn, args_and_kwargs, /*as_held_buffers=*/false).tensors);
}

std::vector<HeldBuffer> buffers_held(const py::handle& fn, const py::tuple& args_and_kwargs) {
  return std::move(walk_from(fn, args_and_kwargs, /*as_held_buffers=*/true).buffers);
}

}  // namespace remat::python
