#pragma once
// What the checkpoint runtime needs to run Python code: Python objects it can hold, copy and
// drop on any thread (autograd's included), Python callables as flat tensor functions with
// their argument and result structure, and Python state hooks and checkpoint contexts.

#include <remat/context.hpp>
#include <remat/remat.hpp>
#include <remat/saved_tensor_hooks.hpp>
#include <remat/state_hooks.hpp>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <functional>
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

// A Python value with its tensors taken out, in depth-first order: they are the runtime's
// inputs (from a call's arguments, positional and keyword) or outputs (from a result).
// Tuples, lists, dicts (their subclasses too: a ModelOutput) and dataclasses are walked; anything
// else (None, numbers, modules, containers holding neither tensors nor a list or dict) is kept
// as it is and comes back as the same object. A list or dict comes back as a copy, tensors in it
// or not.
class Structure {
 public:
  // Throws py::type_error for a value nested deeper than 64 containers (or one holding itself).
  static Structure of(const py::handle& value, TensorList& tensors, const std::function<std::string()>& name);
  py::object rebuild(const TensorList& tensors) const;

 private:
  // tuple_subclass: another tuple type built from one tuple, such as torch.return_types (what
  // torch.max(x, dim) returns); a named tuple takes its fields as arguments instead. dict_subclass
  // (a Hugging Face ModelOutput, an OrderedDict) and dataclass are built as a shallow copy of the
  // value with its items or fields set.
  enum class Kind : std::uint8_t {
    tensor,
    tuple,
    list,
    dict,
    named_tuple,
    tuple_subclass,
    dict_subclass,
    dataclass,
    constant
  };
  struct Node {
    Kind kind = Kind::constant;
    std::size_t children = 0;  // for containers
    // The value (constant), the dict's keys (dict), the type (named_tuple, tuple_subclass), the
    // value and its keys or field names (dict_subclass, dataclass)
    PyRef object;
  };
  // Whether the value is rebuilt (a tensor, a list or dict, or a container holding one).
  bool add(const py::handle& value, TensorList& tensors, int depth, const std::function<std::string()>& name);
  py::object build(std::size_t& node, std::size_t& tensor, const TensorList& tensors) const;
  std::vector<Node> nodes_;  // in preorder
};

// The (args, kwargs) a call was given and its tensors (Structure::of's), until forward's body
// takes them: where the runtime hands forward the given tensors themselves, the body runs on the
// caller's own arguments, so that what it does to the caller's containers (an auxiliary loss
// appended to a list, a key added to a dict) reaches the caller, as without checkpointing. A
// recompute runs on a copy built around its own tensors.
struct GivenCall {
  PyRef arguments;
  TensorList tensors;
};

// `fn(*args, **kwargs)` as the runtime's flat function, with `call` the structure of
// (args, kwargs), called with the GIL from whichever thread runs it. Records the result
// structure of the first call in `result`. `name` names the call in errors; it is called only
// when one is raised.
FlatFunction python_body(PyRef fn, Structure call, GivenCall given, std::shared_ptr<std::optional<Structure>> result,
                         std::function<std::string()> name);

// remat.RecomputeStateHook subclasses (any object with snapshot() and restore(state)).
std::shared_ptr<RecomputeStateHook> python_state_hook(py::object hook);

// A zero-argument callable returning an object with any of enter_forward, exit_forward,
// enter_recompute and exit_recompute.
CheckpointContextFactory python_context_factory(py::object factory);

// The runtime's context factory for a remat.RecomputeReplay channel; empty for other objects.
CheckpointContextFactory replay_context_factory(const py::handle& context);

// remat._C.RecomputeReplay, RecomputeReplayRecorder and ReplayScope (replay_bindings.cpp).
void bind_replay(py::module_& m);

// remat._C.SavedTensorHooks and its scope (saved_tensor_hooks_bindings.cpp); the runtime's
// pair for one of them, null for None.
void bind_saved_tensor_hooks(py::module_& m);
std::shared_ptr<SavedTensorHooks> saved_tensor_hooks_of(const py::handle& hooks);

// remat._C.KeptOps, its scope, and kept_op_outputs(): ops kept inside recomputed regions
// (kept_ops_bindings.cpp).
void bind_kept_ops(py::module_& m);

// remat._C.TrackEnter, TrackLeave, GradientTag and RetagLog: remat_alloc.track's hooks as C++
// callables (tracking_bindings.cpp).
void bind_tracking(py::module_& m);

}  // namespace remat::python
