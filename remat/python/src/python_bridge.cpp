#include "python_bridge.hpp"

#include "held_tensors.hpp"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <string_view>
#include <utility>

namespace remat::python {

// Drops its object with the GIL held, whichever thread drops the last copy.
struct PyRef::Holder {
  explicit Holder(py::object held) : object(std::move(held)) {}
  ~Holder() {
    if (!Py_IsInitialized()) {  // the interpreter is gone: nothing left to release
      (void)object.release();
      return;
    }
    py::gil_scoped_acquire gil;
    object = py::object();
  }
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;
  py::object object;
};

PyRef::PyRef(py::object object) : holder_(std::make_shared<Holder>(std::move(object))) {}

const py::object& PyRef::get() const { return holder_->object; }

namespace {

bool is_tensor(const py::handle& value) { return THPVariable_Check(value.ptr()); }

at::Tensor tensor_of(const py::handle& value) { return THPVariable_Unpack(value.ptr()); }

// "an int", "a tuple": the value's type as a message names it.
std::string type_name(const py::handle& value) {
  const std::string name = py::str(py::type::handle_of(value).attr("__name__"));
  const bool vowel = !name.empty() && std::string_view("aeiouAEIOU").find(name.front()) != std::string_view::npos;
  return (vowel ? "an " : "a ") + name;
}

constexpr int kMaxDepth = 64;

// dataclasses.fields and copy.copy, held for the process's lifetime.
const py::handle& dataclass_fields() {
  static const py::handle fields = py::module_::import("dataclasses").attr("fields").cast<py::object>().release();
  return fields;
}

const py::handle& shallow_copy() {
  static const py::handle copy = py::module_::import("copy").attr("copy").cast<py::object>().release();
  return copy;
}

// Runs the body with Dynamo's frame hook off: under torch.compile, Dynamo cannot trace the
// runtime and runs it eagerly, and a body it compiled in forward would run eagerly in recompute
// (backward is outside the compiled frame) and recreate other tensors. Both run eagerly instead.
class DynamoOff {
 public:
  // Outside torch.compile there is no frame hook: one call finds that, and nothing is set.
  DynamoOff() : prior_(functions().get_callback()) {
    if (!prior_.is_none()) functions().set_callback(py::none());
  }
  ~DynamoOff() {
    if (prior_.is_none()) return;
    try {
      functions().set_callback(prior_);
    } catch (const py::error_already_set&) {  // cannot fail for a callback it returned; never throw here
    }
  }
  DynamoOff(const DynamoOff&) = delete;
  DynamoOff& operator=(const DynamoOff&) = delete;

 private:
  struct Functions {
    py::object get_callback;
    py::object set_callback;
  };
  static const Functions& functions() {
    // Leaked: they must outlive every call, and the interpreter owns them anyway.
    static const auto* found = [] {
      const py::module_ module = py::module_::import("torch._C._dynamo.eval_frame");
      return new Functions{module.attr("get_eval_frame_callback"), module.attr("set_eval_frame")};
    }();
    return *found;
  }
  py::object prior_;
};

}  // namespace

Structure Structure::of(const py::handle& value, TensorList& tensors, const std::function<std::string()>& name) {
  Structure structure;
  structure.add(value, tensors, 0, name);
  return structure;
}

bool Structure::add(const py::handle& value, TensorList& tensors, int depth, const std::function<std::string()>& name) {
  if (is_tensor(value)) {
    nodes_.push_back({Kind::tensor, 0, {}});
    tensors.push_back(tensor_of(value));
    return true;
  }
  Kind kind = Kind::constant;
  if (PyTuple_CheckExact(value.ptr())) kind = Kind::tuple;
  else if (PyList_CheckExact(value.ptr())) kind = Kind::list;
  else if (PyDict_CheckExact(value.ptr())) kind = Kind::dict;
  else if (PyTuple_Check(value.ptr()) && py::hasattr(value, "_fields")) kind = Kind::named_tuple;
  else if (PyTuple_Check(value.ptr())) kind = Kind::tuple_subclass;
  else if (PyDict_Check(value.ptr()))
    kind = Kind::dict_subclass;
  else if (py::hasattr(py::type::handle_of(value), "__dataclass_fields__"))
    kind = Kind::dataclass;
  if (kind == Kind::constant) {
    nodes_.push_back({Kind::constant, 0, PyRef(py::reinterpret_borrow<py::object>(value))});
    return false;
  }
  if (depth >= kMaxDepth) {
    throw py::type_error(name() + ": an argument or result is nested deeper than " + std::to_string(kMaxDepth) +
                         " containers (or holds itself); pass flatter structures");
  }
  const std::size_t node = nodes_.size();
  // A list or dict the body may change (an auxiliary loss appended) is built anew for each
  // recompute, tensors in it or not: recompute's changes never reach the caller's. A subclass or
  // dataclass without tensors stays itself: copying it may be refused (a frozen dict's setitem)
  bool built = kind == Kind::list || kind == Kind::dict;
  nodes_.push_back({kind, 0, {}});
  if (kind == Kind::dict || kind == Kind::dict_subclass) {
    const py::dict dict = py::reinterpret_borrow<py::dict>(value);
    py::list keys;
    for (const auto [key, item] : dict) {
      keys.append(key);
      built = add(item, tensors, depth + 1, name) || built;
    }
    nodes_[node].children = py::len(keys);
    nodes_[node].object = PyRef(kind == Kind::dict ? py::object(std::move(keys))
                                                   : py::make_tuple(py::reinterpret_borrow<py::object>(value), keys));
  } else if (kind == Kind::dataclass) {
    py::list fields;
    for (const py::handle field : dataclass_fields()(value)) {
      const py::object field_name = field.attr("name");
      fields.append(field_name);
      built = add(value.attr(field_name), tensors, depth + 1, name) || built;
    }
    nodes_[node].children = py::len(fields);
    nodes_[node].object = PyRef(py::make_tuple(py::reinterpret_borrow<py::object>(value), fields));
  } else {
    std::size_t children = 0;
    for (const py::handle item : value) {
      built = add(item, tensors, depth + 1, name) || built;
      ++children;
    }
    nodes_[node].children = children;
    if (kind == Kind::named_tuple || kind == Kind::tuple_subclass) {
      nodes_[node].object = PyRef(py::reinterpret_borrow<py::object>(py::type::handle_of(value)));
    }
  }
  if (!built) {  // constants alone, in a tuple, a dict subclass or a dataclass: kept itself
    nodes_.resize(node);
    nodes_.push_back({Kind::constant, 0, PyRef(py::reinterpret_borrow<py::object>(value))});
  }
  return built;
}

py::object Structure::rebuild(const TensorList& tensors) const {
  std::size_t node = 0;
  std::size_t tensor = 0;
  return build(node, tensor, tensors);
}

py::object Structure::build(std::size_t& node, std::size_t& tensor, const TensorList& tensors) const {
  const Node& here = nodes_.at(node++);
  switch (here.kind) {
    case Kind::tensor: return py::cast(tensors.at(tensor++));
    case Kind::constant: return here.object.get();
    case Kind::dict: {
      py::dict dict;
      const py::list keys = here.object.get();
      for (std::size_t i = 0; i < here.children; ++i) dict[keys[i]] = build(node, tensor, tensors);
      return dict;
    }
    case Kind::dict_subclass:
    case Kind::dataclass: {
      // A shallow copy of the value with its items or fields built anew (a Hugging Face ModelOutput,
      // an OrderedDict, a dataclass of tensors): its type and its other attributes as they were
      const py::tuple original_and_keys = here.object.get();
      py::object built = shallow_copy()(original_and_keys[0]);
      const py::list keys = original_and_keys[1];
      for (std::size_t i = 0; i < here.children; ++i) {
        py::object item = build(node, tensor, tensors);
        if (here.kind == Kind::dict_subclass) {
          built[keys[i]] = item;
        } else if (PyObject_GenericSetAttr(built.ptr(), keys[i].ptr(), item.ptr()) != 0) {  // frozen ones too
          throw py::error_already_set();
        }
      }
      return built;
    }
    case Kind::list: {
      py::list list(here.children);
      for (std::size_t i = 0; i < here.children; ++i) list[i] = build(node, tensor, tensors);
      return list;
    }
    case Kind::tuple:
    case Kind::named_tuple:
    case Kind::tuple_subclass: {
      py::tuple items(here.children);
      for (std::size_t i = 0; i < here.children; ++i) items[i] = build(node, tensor, tensors);
      if (here.kind == Kind::tuple) return items;
      if (here.kind == Kind::tuple_subclass) return here.object.get()(items);
      return here.object.get()(*items);
    }
  }
  return py::none();
}

namespace {

// Whether the runtime hands the body the very tensors the call was given.
bool given_tensors(const TensorList& inputs, const TensorList& given) {
  return inputs.size() == given.size() &&
         std::equal(inputs.begin(), inputs.end(), given.begin(),
                    [](const at::Tensor& a, const at::Tensor& b) { return a.is_same(b); });
}

}  // namespace

FlatFunction python_body(PyRef fn, Structure call, GivenCall given, std::shared_ptr<std::optional<Structure>> result,
                         std::function<std::string()> name) {
  return [fn = std::move(fn), call = std::move(call),
          given = std::make_shared<std::optional<GivenCall>>(std::move(given)), result = std::move(result),
          name = std::move(name)](const TensorList& inputs) {
    return with_gil([&] {
      std::optional<GivenCall> forward_call;
      forward_call.swap(*given);  // forward's alone (the first run): let go of after it
      const py::tuple args_and_kwargs = forward_call && given_tensors(inputs, forward_call->tensors)
                                            ? py::tuple(forward_call->arguments.get())
                                            : call.rebuild(inputs);
      note_tensors_held_by_the_body([&] { return tensors_held(fn.get(), args_and_kwargs); });
      note_buffers_held_by_the_body([&] { return buffers_held(fn.get(), args_and_kwargs); });
      py::object returned;
      {
        DynamoOff eager;
        returned = fn.get()(*args_and_kwargs[0], **args_and_kwargs[1]);
      }
      TensorList outputs;
      Structure structure = Structure::of(returned, outputs, name);
      if (outputs.empty()) {
        throw py::type_error(name() +
                             " must return at least one tensor (alone, or inside tuples, lists, dicts or dataclasses); "
                             "it returned " +
                             type_name(returned));
      }
      if (!*result) *result = std::move(structure);
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
