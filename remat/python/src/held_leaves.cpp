#include "held_leaves.hpp"

#include <torch/csrc/autograd/python_variable.h>

#include <unordered_set>

namespace remat::python {
namespace py = pybind11;

namespace {

// Closures of closures: a plan's wrapper around a lambda around a layer is three.
constexpr int kClosureDepth = 3;

// Held for the process's lifetime.
const py::handle& module_type() {
  static const py::handle type = py::module_::import("torch.nn").attr("Module").cast<py::object>().release();
  return type;
}

const py::handle& partial_type() {
  static const py::handle type = py::module_::import("functools").attr("partial").cast<py::object>().release();
  return type;
}

class Walk {
 public:
  TensorList leaves;

  void callable(const py::handle& object, int depth) {
    if (object.ptr() == nullptr || depth > kClosureDepth || !seen_.insert(object.ptr()).second) return;
    PyObject* raw = object.ptr();
    if (PyObject_IsInstance(raw, module_type().ptr()) == 1) {
      module(object);
    } else if (PyMethod_Check(raw)) {
      callable(PyMethod_GET_SELF(raw), depth);
      callable(PyMethod_GET_FUNCTION(raw), depth);
    } else if (PyFunction_Check(raw)) {
      PyObject* closure = PyFunction_GET_CLOSURE(raw);
      if (closure == nullptr || !PyTuple_Check(closure)) return;
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(closure); ++i) {
        PyObject* cell = PyTuple_GET_ITEM(closure, i);
        if (PyCell_Check(cell) && PyCell_GET(cell) != nullptr) callable(PyCell_GET(cell), depth + 1);
      }
    } else if (PyObject_IsInstance(raw, partial_type().ptr()) == 1) {
      callable(object.attr("func"), depth + 1);
      for (const py::handle arg : object.attr("args")) callable(arg, depth + 1);
    }
    PyErr_Clear();  // an isinstance check that raised (a proxy object) is a value that holds nothing here
  }

 private:
  void module(const py::handle& object) {
    for (const char* members : {"_parameters", "_buffers"}) {
      const py::object dict = py::getattr(object, members, py::none());
      if (!PyDict_Check(dict.ptr())) continue;
      for (const auto& item : py::reinterpret_borrow<py::dict>(dict)) {
        if (THPVariable_Check(item.second.ptr())) leaves.push_back(THPVariable_Unpack(item.second.ptr()));
      }
    }
    const py::object children = py::getattr(object, "_modules", py::none());
    if (!PyDict_Check(children.ptr())) return;
    for (const auto& item : py::reinterpret_borrow<py::dict>(children)) {
      if (!item.second.is_none() && seen_.insert(item.second.ptr()).second) module(item.second);
    }
  }

  std::unordered_set<PyObject*> seen_;
};

}  // namespace

TensorList leaves_held(const py::handle& fn, const py::tuple& positional) {
  Walk walk;
  walk.callable(fn, 0);
  for (const py::handle arg : positional) {
    if (PyObject_IsInstance(arg.ptr(), module_type().ptr()) == 1) walk.callable(arg, 0);
  }
  PyErr_Clear();
  return std::move(walk.leaves);
}

}  // namespace remat::python
