#pragma once
// What the checkpoint runtime needs to run Python code: Python objects it can hold, copy and
// drop on any thread (autograd's included), Python callables as flat tensor functions with
// their argument and result structure, and Python state hooks and checkpoint contexts.

#include <remat/context.hpp>
#include <remat/remat.hpp>
#include <remat/state_hooks.hpp>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace remat::python {

namespace py = pybind11;

// A Python object owned from C++: copies share it, and the last one drops it with the GIL
// held, whichever thread that is (recompute runs on autograd's).
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(py::object object);
  // Needs the GIL.
  const py::object& get() const;

 private:
  struct Holder;
  std::shared_ptr<Holder> holder_;
};

// Runs `call` with the GIL; a Python exception becomes torch's python_error, saved so that it
// can be raised again on another thread with its type and traceback (backward() raises what
// a recompute raised).
template <typename Call>
auto with_gil(Call&& call) {
  py::gil_scoped_acquire gil;
  try {
    return call();
  } catch (py::error_already_set& e) {
    e.restore();
    python_error error;
    error.persist();
    throw error;
  }
}

// A call's positional arguments: tensors and one level of tuples or lists of tensors become
// the checkpoint's inputs; anything else is passed through as it is.
class CallStructure {
 public:
  static CallStructure of(const py::tuple& args, TensorList& inputs);
  py::tuple rebuild(const TensorList& inputs) const;

 private:
  enum class Kind { tensor, tuple, list, constant };
  struct Slot {
    Kind kind = Kind::constant;
    std::size_t count = 0;  // tensors, for tensor (1), tuple and list
    PyRef constant;
  };
  std::vector<Slot> slots_;
};

// What the function returned: a tensor, or a tuple or list of tensors.
class ResultStructure {
 public:
  // Throws py::type_error naming what `fn_name` returned instead.
  static ResultStructure of(const py::handle& result, TensorList& outputs, const std::string& fn_name);
  py::object rebuild(const TensorList& outputs) const;

 private:
  enum class Kind { tensor, tuple, list };
  Kind kind_ = Kind::tensor;
};

// `fn(*args, **kwargs)` as the runtime's flat function, called with the GIL from whichever
// thread runs it. Records the result structure of the first call in `result`.
FlatFunction python_body(PyRef fn, PyRef kwargs, CallStructure call, std::shared_ptr<std::optional<ResultStructure>> result,
                         std::string name);

// remat.RecomputeStateHook subclasses (any object with snapshot() and restore(state)).
std::shared_ptr<RecomputeStateHook> python_state_hook(py::object hook);

// A zero-argument callable returning an object with any of enter_forward, exit_forward,
// enter_recompute and exit_recompute.
CheckpointContextFactory python_context_factory(py::object factory);

}  // namespace remat::python
