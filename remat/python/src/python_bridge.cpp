#include "python_bridge.hpp"

#include <torch/csrc/autograd/python_variable.h>

#include <string_view>
#include <utility>

namespace remat::python {

struct PyRef::Holder {
  py::object object;
};

PyRef::PyRef(py::object object)
    : holder_(new Holder{std::move(object)}, [](Holder* holder) {
        if (!Py_IsInitialized()) {  // the interpreter is gone: nothing left to release
          (void)holder->object.release();
          delete holder;
          return;
        }
        py::gil_scoped_acquire gil;
        delete holder;
      }) {}

const py::object& PyRef::get() const { return holder_->object; }

namespace {

bool is_tensor(const py::handle& value) { return THPVariable_Check(value.ptr()); }

at::Tensor tensor_of(const py::handle& value) { return THPVariable_Unpack(value.ptr()); }

bool all_tensors(const py::sequence& items) {
  if (py::len(items) == 0) return false;
  for (const py::handle item : items) {
    if (!is_tensor(item)) return false;
  }
  return true;
}

// "an int", "a tuple": the value's type as a message names it.
std::string type_name(const py::handle& value) {
  const std::string name = py::str(py::type::handle_of(value).attr("__name__"));
  const bool vowel = !name.empty() && std::string_view("aeiouAEIOU").find(name.front()) != std::string_view::npos;
  return (vowel ? "an " : "a ") + name;
}

}  // namespace

CallStructure CallStructure::of(const py::tuple& args, TensorList& inputs) {
  CallStructure call;
  for (const py::handle arg : args) {
    Slot slot;
    if (is_tensor(arg)) {
      slot.kind = Kind::tensor;
      slot.count = 1;
      inputs.push_back(tensor_of(arg));
    } else if ((py::isinstance<py::tuple>(arg) || py::isinstance<py::list>(arg)) &&
               all_tensors(py::reinterpret_borrow<py::sequence>(arg))) {
      slot.kind = py::isinstance<py::tuple>(arg) ? Kind::tuple : Kind::list;
      for (const py::handle item : arg) inputs.push_back(tensor_of(item));
      slot.count = py::len(arg);
    } else {
      slot.constant = PyRef(py::reinterpret_borrow<py::object>(arg));
    }
    call.slots_.push_back(std::move(slot));
  }
  return call;
}

py::tuple CallStructure::rebuild(const TensorList& inputs) const {
  py::tuple args(slots_.size());
  std::size_t next = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    switch (slot.kind) {
      case Kind::tensor: args[i] = py::cast(inputs.at(next++)); break;
      case Kind::tuple:
      case Kind::list: {
        py::list items;
        for (std::size_t k = 0; k < slot.count; ++k) items.append(py::cast(inputs.at(next++)));
        args[i] = slot.kind == Kind::tuple ? py::object(py::tuple(items)) : py::object(items);
        break;
      }
      case Kind::constant: args[i] = slot.constant.get(); break;
    }
  }
  return args;
}

ResultStructure ResultStructure::of(const py::handle& result, TensorList& outputs, const std::string& fn_name) {
  ResultStructure structure;
  if (is_tensor(result)) {
    outputs.push_back(tensor_of(result));
    return structure;
  }
  if ((py::isinstance<py::tuple>(result) || py::isinstance<py::list>(result)) &&
      all_tensors(py::reinterpret_borrow<py::sequence>(result))) {
    structure.kind_ = py::isinstance<py::tuple>(result) ? Kind::tuple : Kind::list;
    for (const py::handle item : result) outputs.push_back(tensor_of(item));
    return structure;
  }
  throw py::type_error(fn_name + " must return a tensor, or a tuple or list of tensors; it returned " +
                       (py::isinstance<py::sequence>(result) && !py::isinstance<py::str>(result)
                            ? type_name(result) + " holding something other than tensors (or nothing)"
                            : type_name(result)));
}

py::object ResultStructure::rebuild(const TensorList& outputs) const {
  if (kind_ == Kind::tensor) return py::cast(outputs.at(0));
  py::list items;
  for (const at::Tensor& t : outputs) items.append(py::cast(t));
  if (kind_ == Kind::tuple) return py::tuple(items);
  return items;
}

FlatFunction python_body(PyRef fn, PyRef kwargs, CallStructure call, std::shared_ptr<std::optional<ResultStructure>> result,
                         std::string name) {
  return [fn = std::move(fn), kwargs = std::move(kwargs), call = std::move(call), result = std::move(result),
          name = std::move(name)](const TensorList& inputs) {
    return with_gil([&] {
      const py::object returned = fn.get()(*call.rebuild(inputs), **kwargs.get());
      TensorList outputs;
      ResultStructure structure = ResultStructure::of(returned, outputs, name);
      if (!*result) *result = structure;
      return outputs;
    });
  };
}

namespace {

class PythonStateHook final : public RecomputeStateHook {
 public:
  explicit PythonStateHook(py::object hook) : hook_(std::move(hook)) {}
  std::any snapshot() override {
    return with_gil([&] { return PyRef(hook_.get().attr("snapshot")()); });
  }
  void restore(const std::any& state) override {
    with_gil([&] { hook_.get().attr("restore")(std::any_cast<const PyRef&>(state).get()); });
  }

 private:
  PyRef hook_;
};

class PythonContext final : public CheckpointContext {
 public:
  explicit PythonContext(py::object context) : context_(std::move(context)) {}
  void enter_forward() override { call("enter_forward"); }
  void exit_forward() override { call("exit_forward"); }
  void enter_recompute() override { call("enter_recompute"); }
  void exit_recompute() override { call("exit_recompute"); }

 private:
  void call(const char* method) {
    with_gil([&] {
      if (py::hasattr(context_.get(), method)) context_.get().attr(method)();
    });
  }
  PyRef context_;
};

}  // namespace

std::shared_ptr<RecomputeStateHook> python_state_hook(py::object hook) {
  for (const char* method : {"snapshot", "restore"}) {
    if (!py::hasattr(hook, method)) {
      throw py::type_error("recompute_state_hooks: " + type_name(hook) + " has no " + method +
                           "(); subclass remat.RecomputeStateHook and define snapshot() and restore(state)");
    }
  }
  return std::make_shared<PythonStateHook>(std::move(hook));
}

CheckpointContextFactory python_context_factory(py::object factory) {
  if (!PyCallable_Check(factory.ptr())) {
    throw py::type_error("contexts: " + type_name(factory) +
                         " is not a context factory; pass a remat.RecomputeReplay or a callable returning an object "
                         "with enter_forward/exit_forward/enter_recompute/exit_recompute");
  }
  return [factory = PyRef(std::move(factory))]() -> std::unique_ptr<CheckpointContext> {
    return with_gil([&] { return std::make_unique<PythonContext>(factory.get()()); });
  };
}

}  // namespace remat::python
