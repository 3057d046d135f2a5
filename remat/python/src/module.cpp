// remat._C: the checkpoint runtime for Python processes. The Python API in remat/__init__.py
// wraps these functions.

#include "python_bridge.hpp"

#include <remat/cpu_allocator.hpp>
#include <remat/diagnostics.hpp>
#include <remat/errors.hpp>
#include <remat/remat.hpp>
#include <remat/replay.hpp>
#include <remat/saved_report.hpp>

#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <optional>
#include <string>

namespace remat::python {
namespace {

// Tensors given by keyword would not be the checkpoint's inputs: recompute could not see them.
void refuse_tensor_keywords(const py::dict& kwargs, const std::string& what) {
  for (const auto [key, value] : kwargs) {
    if (THPVariable_Check(value.ptr())) {
      throw py::type_error(what + ": tensor keyword argument '" + py::str(key).cast<std::string>() +
                           "'; pass tensors positionally so that they are the inputs recompute runs on");
    }
  }
}

std::string callable_name(const py::object& fn) {
  if (py::hasattr(fn, "__qualname__")) return py::str(fn.attr("__qualname__"));
  return py::str(py::repr(fn));
}

// The version counter of a tensor decision (none for other objects and inference tensors).
std::optional<std::uint32_t> tensor_version(const py::object& value) {
  if (!THPVariable_Check(value.ptr())) return std::nullopt;
  const at::Tensor& tensor = THPVariable_Unpack(value.ptr());
  if (!tensor.defined() || tensor.is_inference()) return std::nullopt;
  return tensor._version();
}

// remat.RecomputeReplay: a decision recorded in forward and taken back in recompute.
class Replay {
 public:
  explicit Replay(std::string name) : channel_(std::move(name)) {}
  const std::string& name() const { return channel_.name(); }
  // A tensor decision changed in place after forward (ids += offset) would come back changed
  // and recompute would run on other values than forward did: that is refused.
  py::object record_or_replay(const py::object& compute) const {
    const Decision decision = channel_.record_or_replay([&] {
      py::object value = compute();
      return Decision{PyRef(value), tensor_version(value)};
    });
    const py::object& value = decision.value.get();
    if (decision.version && tensor_version(value) != decision.version) {
      throw Error("replay channel '" + name() + "': the tensor recorded in forward was changed in place afterwards (" +
                  "version " + std::to_string(*decision.version) + ", now " +
                  std::to_string(*tensor_version(value)) + "), so replay would hand back the changed value: make "
                  "that operation out-of-place (ids = ids + offset), or return a copy from compute");
    }
    return value;
  }
  CheckpointContextFactory context_factory() const { return channel_.context_factory(); }

 private:
  struct Decision {
    PyRef value;
    std::optional<std::uint32_t> version;
  };
  RecomputeReplay<Decision> channel_;
};

CheckpointOptions options_of(const std::string& region_name, const py::list& state_hooks, const py::list& contexts,
                             bool verify_recompute) {
  CheckpointOptions options;
  options.region_name = region_name;
  options.verify_recompute = verify_recompute;
  for (const py::handle hook : state_hooks) {
    if (py::isinstance<RecomputeStateHook>(hook)) {
      options.recompute_state_hooks.push_back(hook.cast<std::shared_ptr<RecomputeStateHook>>());
    } else {
      options.recompute_state_hooks.push_back(python_state_hook(py::reinterpret_borrow<py::object>(hook)));
    }
  }
  for (const py::handle context : contexts) {
    if (py::isinstance<Replay>(context)) {
      // The factory keeps the Python object, and so the channel, alive as long as the checkpoint.
      options.contexts.push_back([keep = PyRef(py::reinterpret_borrow<py::object>(context)),
                                  factory = context.cast<const Replay&>().context_factory()] { return factory(); });
    } else {
      options.contexts.push_back(python_context_factory(py::reinterpret_borrow<py::object>(context)));
    }
  }
  return options;
}

using ResultSlot = std::shared_ptr<std::optional<ResultStructure>>;

// `runner` gets the body and its inputs, and the slot where the body records the structure of
// its result (a skipped body's comes back from forward through the same slot).
py::object run(const py::object& fn, const py::tuple& args, const py::dict& kwargs, const std::string& what,
               const std::function<TensorList(FlatFunction, TensorList, ResultSlot&)>& runner) {
  refuse_tensor_keywords(kwargs, what);
  TensorList inputs;
  CallStructure call = CallStructure::of(args, inputs);
  auto result = std::make_shared<std::optional<ResultStructure>>();
  FlatFunction body = python_body(PyRef(fn), PyRef(kwargs), std::move(call), result, what);
  const TensorList outputs = runner(std::move(body), std::move(inputs), result);
  if (!result || !*result) throw Error(what + ": no result structure recorded for a skipped body");
  return (*result)->rebuild(outputs);
}

PyObject* g_remat_error = nullptr;  // remat.RematError, for the lifetime of the process

[[noreturn]] void raise_remat_error(const Error& error) {
  py::gil_scoped_acquire gil;
  PyErr_SetString(g_remat_error, error.what());
  python_error raised;
  raised.persist();
  throw raised;
}

// A report's text (str() and format()) and its dump (to_json()).
template <typename Report>
void def_report_text(py::class_<Report> report) {
  report.def("format", &Report::format).def("to_json", &Report::to_json).def("__str__", &Report::format);
}

// A C++ guard as a Python context manager.
template <typename Guard>
void bind_guard(py::module_& m, const char* name, const char* doc) {
  struct Scope {
    std::optional<Guard> guard;
  };
  py::class_<Scope>(m, name, doc)
      .def(py::init<>())
      .def("__enter__", [](Scope& scope) { scope.guard.emplace(); })
      .def("__exit__", [](Scope& scope, const py::args&) { scope.guard.reset(); });
}

}  // namespace
}  // namespace remat::python

PYBIND11_MODULE(_C, m) {
  using namespace remat;
  using namespace remat::python;
  m.doc() = "remat's checkpoint runtime (use the remat package)";

  // A Python exception raised in a body (in forward, or in recompute on autograd's thread)
  // reaches the caller as itself.
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (python_error& e) {
      e.restore();
    }
  });
  // The runtime's errors are remat.RematError, a RuntimeError: in forward (nested checkpoints,
  // duplicate region names, ...) through pybind11, in backward (a placeholder read, a
  // verify_recompute mismatch) as a Python error PyTorch's engine raises again as it is.
  g_remat_error = py::register_local_exception<Error>(m, "RematError", PyExc_RuntimeError).ptr();
  detail::set_backward_error_translator(&raise_remat_error);

  m.def(
      "checkpoint",
      [](const py::object& fn, const py::tuple& args, const py::dict& kwargs, const std::string& region_name,
         const py::list& state_hooks, const py::list& contexts, bool verify_recompute) {
        const CheckpointOptions options = options_of(region_name, state_hooks, contexts, verify_recompute);
        return run(fn, args, kwargs, "checkpoint '" + region_name + "' (" + callable_name(fn) + ")",
                   [&](FlatFunction body, TensorList inputs, ResultSlot&) {
                     return detail::run_checkpoint(options, std::move(body), std::move(inputs));
                   });
      },
      py::arg("fn"), py::arg("args"), py::arg("kwargs"), py::arg("region_name"), py::arg("recompute_state_hooks"),
      py::arg("contexts"), py::arg("verify_recompute"));
  m.def(
      "region",
      [](const py::object& fn, const py::tuple& args, const py::dict& kwargs, const std::string& name,
         bool recompute) {
        return run(fn, args, kwargs, "region '" + name + "' (" + callable_name(fn) + ")",
                   [&](FlatFunction body, TensorList inputs, ResultSlot& result) {
                     std::shared_ptr<void> annotation = result;
                     TensorList outputs =
                         detail::run_region(std::move(body), name, recompute, std::move(inputs), &annotation);
                     result = std::static_pointer_cast<std::optional<ResultStructure>>(annotation);
                     return outputs;
                   });
      },
      py::arg("fn"), py::arg("args"), py::arg("kwargs"), py::arg("name"), py::arg("recompute"));
  m.def("is_recomputing", &is_recomputing, "True while recompute runs a checkpoint's forward again.");
  m.def("recompute_needs_tensor", &recompute_needs_tensor, py::arg("tensor"),
        "Keeps a save region's output for recompute instead of a placeholder.");

  py::class_<RecomputeStateHook, std::shared_ptr<RecomputeStateHook>>(m, "NativeStateHook",
                                                                     "A state hook implemented in C++.");
  m.def("cpu_rng_state_hook", &cpu_rng_state_hook, "Puts the CPU generator's state back for recompute.");

  py::class_<Replay>(m, "RecomputeReplay", "Decisions forward records and recompute takes back in order.")
      .def(py::init<std::string>(), py::arg("name"))
      .def_property_readonly("name", &Replay::name)
      .def("record_or_replay", &Replay::record_or_replay, py::arg("compute"),
           "Under replay, the recorded value (compute() when the log ran out); under record, compute() recorded; "
           "elsewhere compute(). compute() runs without autograd.");

  py::class_<RegionDecision>(m, "RegionDecision")
      .def_readonly("name", &RegionDecision::name)
      .def_readonly("saved", &RegionDecision::saved);
  py::class_<CheckpointScope>(m, "CheckpointScope")
      .def_readonly("name", &CheckpointScope::name)
      .def_readonly("regions", &CheckpointScope::regions);
  def_report_text(py::class_<RematTrace>(m, "RematTrace").def_readonly("scopes", &RematTrace::scopes));
  m.def("collect_trace", &collect_trace, "The checkpoints this thread ran forward since the last call; clears them.");

  py::class_<ResidentTensor>(m, "ResidentTensor")
      .def_readonly("name", &ResidentTensor::name)
      .def_readonly("shape", &ResidentTensor::shape)
      .def_readonly("dtype", &ResidentTensor::dtype)
      .def_readonly("bytes", &ResidentTensor::bytes)
      .def_readonly("site", &ResidentTensor::site);
  py::class_<RegionResidency>(m, "RegionResidency")
      .def_readonly("region", &RegionResidency::region)
      .def_readonly("bytes", &RegionResidency::bytes)
      .def_readonly("storages", &RegionResidency::storages)
      .def_readonly("tensors", &RegionResidency::tensors);
  def_report_text(py::class_<MemoryReport>(m, "MemoryReport")
                      .def_readonly("checkpoint", &MemoryReport::checkpoint)
                      .def_readonly("regions", &MemoryReport::regions));
  m.def("current_memory_report", &current_memory_report);
  m.def("format_current_memory_report", &format_current_memory_report);

  py::class_<SavedGroup>(m, "SavedGroup")
      .def_readonly("label", &SavedGroup::label)
      .def_readonly("bytes", &SavedGroup::bytes)
      .def_readonly("count", &SavedGroup::count)
      .def_readonly("storages", &SavedGroup::storages);
  def_report_text(py::class_<SavedReport>(m, "SavedReport")
                      .def_readonly("total_bytes", &SavedReport::total_bytes)
                      .def_readonly("region_bytes", &SavedReport::region_bytes)
                      .def_readonly("outside_bytes", &SavedReport::outside_bytes)
                      .def_readonly("regions", &SavedReport::regions)
                      .def_readonly("region_groups", &SavedReport::region_groups)
                      .def_readonly("node_groups", &SavedReport::node_groups));
  m.def("saved_report", &saved_report, py::arg("loss"));
  bind_guard<SavedTensorsTracking>(m, "track_saved_tensors",
                                   "Records tensors autograd saves outside checkpoints, for saved_report().");
  bind_guard<CpuAllocatorGuard>(m, "tag_cpu_tensors",
                                "Allocates CPU tensors through the tagging allocator, so they carry tags.");
  m.def("live_bytes", &live_bytes, py::arg("region_prefix") = "",
        "Requested bytes live under a region (and its nested regions), on every allocator.");
  m.def("write_dump", &write_dump, py::arg("path"), py::arg("json"), "Writes a dump atomically.");
}
