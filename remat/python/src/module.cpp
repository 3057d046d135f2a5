// remat._C: the checkpoint runtime for Python processes. The remat package's modules wrap
// these functions.

#include "python_bridge.hpp"

#include <remat/cpu_allocator.hpp>
#include <remat/cpu_offload.hpp>
#include <remat/diagnostics.hpp>
#include <remat/errors.hpp>
#include <remat/input_reads.hpp>
#include <remat/remat.hpp>
#include <remat/saved_report.hpp>

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/bytes.hpp>
#include <remat/alloc/dump.hpp>
#include <remat/alloc/names.hpp>
#include <remat/alloc/oom.hpp>
#include <remat/alloc/tags.hpp>

#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <optional>
#include <string>

namespace remat::python {
namespace {

// "checkpoint 'layers.0' (Block.forward)": built only when an error names the call, since
// repr() of a bound method or functools.partial can print a whole module.
std::function<std::string()> call_name(std::string kind, const PyRef& fn) {
  return [kind = std::move(kind), fn] {
    const py::object& callable = fn.get();
    if (py::hasattr(callable, "__qualname__")) return kind + " (" + py::str(callable.attr("__qualname__")).cast<std::string>() + ")";
    return kind + " (" + py::str(py::type::handle_of(callable).attr("__name__")).cast<std::string>() + ")";
  };
}

CheckpointOptions options_of(const std::string& region_name, const py::list& state_hooks, const py::list& contexts,
                             bool verify_recompute, const py::handle& saved_tensor_hooks,
                             std::shared_ptr<const budget::RegionChoices> plan) {
  CheckpointOptions options;
  options.region_name = region_name;
  options.plan = std::move(plan);
  options.verify_recompute = verify_recompute;
  options.saved_tensor_hooks = saved_tensor_hooks_of(saved_tensor_hooks);
  for (const py::handle hook : state_hooks) {
    if (py::isinstance<RecomputeStateHook>(hook)) {
      options.recompute_state_hooks.push_back(hook.cast<std::shared_ptr<RecomputeStateHook>>());
    } else {
      options.recompute_state_hooks.push_back(python_state_hook(py::reinterpret_borrow<py::object>(hook)));
    }
  }
  for (const py::handle context : contexts) {
    if (auto factory = replay_context_factory(context)) {
      options.contexts.push_back(std::move(factory));
    } else {
      options.contexts.push_back(python_context_factory(py::reinterpret_borrow<py::object>(context)));
    }
  }
  return options;
}

// A Python object kept with one checkpoint call (CheckpointOptions::caller): what the package's
// plan or profile knows of the call, read back by _C.checkpoint_caller() while its body runs.
struct PythonCaller : CheckpointCaller {
  explicit PythonCaller(py::object held) : object(std::move(held)) {}
  PyRef object;
};

using ResultSlot = std::shared_ptr<std::optional<Structure>>;

// `runner` gets the body and its inputs, and the slot where the body records the structure of
// its result (a skipped body's comes back from forward through the same slot).
// `kind` names the call in errors ("checkpoint 'layers.0'").
py::object run(const py::object& fn, const py::tuple& args, const py::dict& kwargs, std::string kind,
               const std::function<TensorList(FlatFunction, TensorList, ResultSlot&)>& runner) {
  PyRef callable(fn);
  const std::function<std::string()> name = call_name(std::move(kind), callable);
  TensorList inputs;
  const py::tuple arguments = py::make_tuple(args, kwargs);
  Structure call = Structure::of(arguments, inputs, name);
  auto result = std::make_shared<std::optional<Structure>>();
  FlatFunction body =
      python_body(std::move(callable), std::move(call), GivenCall{PyRef(arguments), inputs}, result, name);
  const TensorList outputs = runner(std::move(body), std::move(inputs), result);
  if (!result || !*result) throw Error(name() + ": no result structure recorded for a skipped body");
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

PyObject* g_recompute_stopped = nullptr;  // remat.RecomputeStopped, for the lifetime of the process

// Recompute's early stop, raised through the body from a saved-tensor hook (PyTorch's bindings
// restore a python_error as the Python exception it holds) or a skipped save region (through
// the translator below).
[[noreturn]] void raise_recompute_stopped() {
  py::gil_scoped_acquire gil;
  PyErr_SetString(g_recompute_stopped, "remat: recompute stopped early (every tensor backward needs exists)");
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
  detail::set_api_spelling(detail::ApiSpelling::python);

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
  // A BaseException, as GeneratorExit is: a body's `except Exception:` or `except RuntimeError:`
  // (a kernel fallback) does not catch it.
  g_recompute_stopped = PyErr_NewExceptionWithDoc(
      "remat.RecomputeStopped",
      "Raised through a checkpoint's body in recompute once every tensor backward needs exists; "
      "the checkpoint catches it. A body that catches every exception must raise it again.",
      PyExc_BaseException, nullptr);
  if (g_recompute_stopped == nullptr) throw py::error_already_set();
  m.attr("RecomputeStopped") = py::handle(g_recompute_stopped);
  detail::set_recompute_stop_raiser(&raise_recompute_stopped);

  m.def(
      "checkpoint",
      [](const py::object& fn, const py::tuple& args, const py::dict& kwargs, const std::string& region_name,
         const py::list& state_hooks, const py::list& contexts, bool verify_recompute,
         const py::object& saved_tensor_hooks, std::shared_ptr<const budget::RegionChoices> plan,
         const py::object& caller) {
        CheckpointOptions options =
            options_of(region_name, state_hooks, contexts, verify_recompute, saved_tensor_hooks, std::move(plan));
        if (!caller.is_none()) options.caller = std::make_shared<PythonCaller>(caller);
        // The runtime's warnings in forward (TORCH_WARN) reach Python as warnings, as it returns
        torch::PyWarningHandler warnings;
        try {
          return run(fn, args, kwargs, "checkpoint '" + region_name + "'",
                     [&](FlatFunction body, TensorList inputs, ResultSlot&) {
                       return detail::run_checkpoint(options, std::move(body), std::move(inputs));
                     });
        } catch (...) {
          warnings.set_in_exception();  // (said beside the error, never thrown in its place)
          throw;
        }
      },
      py::arg("fn"), py::arg("args"), py::arg("kwargs"), py::arg("region_name"), py::arg("recompute_state_hooks"),
      py::arg("contexts"), py::arg("verify_recompute"), py::arg("saved_tensor_hooks") = py::none(),
      py::arg("plan") = nullptr, py::arg("caller") = py::none());
  m.def("given_back_to_recompute", &given_back_to_recompute, py::arg("tensor"),
        "Whether the tensor shares its storage with a buffer the checkpoint whose forward runs on this thread gives "
        "back to recompute as forward read it.");
  m.def(
      "checkpoint_caller",
      []() -> py::object {
        const auto* caller = dynamic_cast<const PythonCaller*>(checkpoint_caller());
        return caller != nullptr ? caller->object.get() : py::none();
      },
      "The caller object given to the checkpoint whose body runs on this thread (forward or recompute), or None.");
  // A budget plan's choices, made once per plan and handed to every checkpoint it applies to.
  py::class_<budget::RegionChoices, std::shared_ptr<budget::RegionChoices>>(m, "RegionChoices")
      .def(py::init([](const std::vector<std::pair<std::string, bool>>& recompute_by_region,
                       const std::vector<std::string>& offloaded) {
             std::vector<std::pair<std::string, budget::Choice>> choices;
             for (const auto& [name, recompute] : recompute_by_region) {
               choices.emplace_back(name, recompute ? budget::Choice::recompute : budget::Choice::save);
             }
             return std::make_shared<budget::RegionChoices>(std::move(choices), offloaded);
           }),
           py::arg("recompute_by_region"), py::arg("offloaded") = std::vector<std::string>{},
           "offloaded: entries the runtime offloads itself (plan_offloader); the Python layer's plans pass none "
           "and offload through their own remat.CpuOffload.")
      .def_static(
          "from_plan_json",
          [](const std::string& text, const std::string& source) {
            return std::make_shared<budget::RegionChoices>(budget::plan_from_json(text, source));
          },
          py::arg("text"), py::arg("source") = "plan",
          "A remat-plan dump's choices as the C++ runtime applies them (remat::budget::RegionChoices(plan)).")
      .def("recompute_of", [](const budget::RegionChoices& choices, const std::string& region) -> std::optional<bool> {
        const auto choice = choices.choice_for(region);
        if (!choice) return std::nullopt;
        return *choice == budget::Choice::recompute;
      })
      .def("offloads", &budget::RegionChoices::offloads, py::arg("region"));
  m.def(
      "plan_offloader",
      [](const std::shared_ptr<budget::RegionChoices>& plan) { return plan_offloader(plan); }, py::arg("plan"),
      "The runtime's offloader for a plan that offloads regions (remat::plan_offloader), or None.");
  m.def(
      "region",
      [](const py::object& fn, const py::tuple& args, const py::dict& kwargs, const std::string& name,
         bool recompute) {
        return run(fn, args, kwargs, "region '" + name + "'",
                   [&](FlatFunction body, TensorList inputs, ResultSlot& result) {
                     std::shared_ptr<void> annotation = result;
                     TensorList outputs =
                         detail::run_region(std::move(body), name, recompute, std::move(inputs), &annotation);
                     result = std::static_pointer_cast<std::optional<Structure>>(annotation);
                     return outputs;
                   });
      },
      py::arg("fn"), py::arg("args"), py::arg("kwargs"), py::arg("name"), py::arg("recompute"));
  m.def("is_recomputing", &is_recomputing, "True while recompute runs a checkpoint's forward again.");
  m.def("is_placeholder", &is_placeholder, py::arg("tensor"),
        "Whether the tensor is (a view of) a placeholder recompute handed back for a skipped save region.");
  m.def("in_checkpoint", &in_checkpoint, "True while a checkpoint's forward or recompute runs on this thread.");
  m.def(
      "recompute_needs_tensor",
      [](const py::args& tensors) {
        for (const py::handle tensor : tensors) {
          if (!THPVariable_Check(tensor.ptr())) {
            throw Error("remat.recompute_needs_tensor() expects Tensor arguments, got " +
                        py::str(py::type::handle_of(tensor).attr("__name__")).cast<std::string>());
          }
          recompute_needs_tensor(THPVariable_Unpack(tensor.ptr()));
        }
      },
      "Keeps save regions' outputs (or tensors sharing their storage) for recompute instead of placeholders.");

  py::class_<RecomputeStateHook, std::shared_ptr<RecomputeStateHook>>(m, "NativeStateHook",
                                                                     "A state hook implemented in C++.");
  m.def("cpu_rng_state_hook", &cpu_rng_state_hook, "Puts the CPU generator's state back for recompute.");

  bind_kept_ops(m);
  bind_replay(m);
  bind_saved_tensor_hooks(m);
  bind_tracking(m);

  py::class_<RegionDecision>(m, "RegionDecision")
      .def_readonly("name", &RegionDecision::name)
      .def_readonly("saved", &RegionDecision::saved);
  py::class_<CheckpointScope>(m, "CheckpointScope")
      .def_readonly("name", &CheckpointScope::name)
      .def_readonly("regions", &CheckpointScope::regions)
      .def_readonly("forward", &CheckpointScope::forward);
  def_report_text(py::class_<RematTrace>(m, "RematTrace")
                      .def(py::init<>())
                      .def_readonly("scopes", &RematTrace::scopes)
                      .def("extend", [](RematTrace& trace, const RematTrace& more) {
                        trace.scopes.insert(trace.scopes.end(), more.scopes.begin(), more.scopes.end());
                      }));
  m.def("collect_trace", &collect_trace, "The checkpoints this thread ran forward since the last call; clears them.");
  m.def(
      "forward_position",
      []() -> py::object {
        const std::optional<ForwardPosition> position = forward_position();
        if (!position) return py::none();
        return py::make_tuple(position->forward, position->regions);
      },
      "(forward, regions entered so far) of the checkpoint forward running on this thread, or None.");

  py::class_<ResidentTensor>(m, "ResidentTensor")
      .def_readonly("name", &ResidentTensor::name)
      .def_readonly("shape", &ResidentTensor::shape)
      .def_readonly("dtype", &ResidentTensor::dtype)
      .def_readonly("bytes", &ResidentTensor::bytes)
      .def_readonly("site", &ResidentTensor::site)
      .def_readonly("address", &ResidentTensor::address)
      .def_readonly("device", &ResidentTensor::device)
      .def_readonly("shares_storage", &ResidentTensor::shares_storage)
      .def_readonly("offloadable", &ResidentTensor::offloadable)
      .def_readonly("leaf_cast", &ResidentTensor::leaf_cast);
  py::class_<RegionResidency>(m, "RegionResidency")
      .def_readonly("region", &RegionResidency::region)
      .def_readonly("bytes", &RegionResidency::bytes)
      .def_readonly("storages", &RegionResidency::storages)
      .def_readonly("tensors", &RegionResidency::tensors);
  py::class_<RerunRegion>(m, "RerunRegion")
      .def_readonly("region", &RerunRegion::region)
      .def_readonly("reason", &RerunRegion::reason);
  def_report_text(py::class_<MemoryReport>(m, "MemoryReport")
                      .def_readonly("checkpoint", &MemoryReport::checkpoint)
                      .def_readonly("regions", &MemoryReport::regions)
                      .def_readonly("bytes", &MemoryReport::bytes)
                      .def_readonly("storages", &MemoryReport::storages)
                      .def_readonly("rerun_regions", &MemoryReport::rerun_regions));
  m.def("current_memory_report", &current_memory_report);
  m.def("live_checkpoint_reports", &live_checkpoint_reports,
        "What every live checkpoint (forward finished, backward may still need it) keeps.");
  py::class_<KeptTensors>(m, "KeptTensors")
      .def_readonly("report", &KeptTensors::report)
      .def_readonly("tensors", &KeptTensors::tensors);
  m.def("newest_live_checkpoint", &newest_live_checkpoint, py::arg("checkpoint"),
        "Of the live checkpoints of this name, the one whose forward finished last: its report and the "
        "tensors it lists, in its order; None where none is live.");
  m.def("record_input_reads", &record_input_reads, py::arg("on"),
        "Starts (or stops) noting, on this thread, which checkpoint inputs ops read, inside save regions "
        "too (a step profile); either way drops what was noted.");
  m.def("take_ops_watched_in_save_regions", &take_ops_watched_in_save_regions,
        "How many ops ran inside save regions while recording input reads since the last call; then forgets "
        "them.");
  m.def("take_collectives", &take_collectives,
        "The names of the collective ops checkpoint forwards ran while recording input reads since the last "
        "call, in order; then forgets them.");
  m.def("take_input_reads", &take_input_reads,
        "The storage addresses of the checkpoint inputs ops read since the last call, each once; then "
        "forgets them.");
  m.def(
      "allocation_phase",
      [](std::uintptr_t address) -> py::object {
        const std::optional<alloc::TagId> tag = alloc::find_block_tag(reinterpret_cast<const void*>(address));
        if (!tag) return py::none();
        return py::str(std::string(alloc::to_string(alloc::tag_of(*tag).phase)));
      },
      py::arg("address"),
      "The phase the live block at `address` (a storage's data pointer) was allocated in, from its "
      "allocation tag: 'forward' inside a checkpoint's forward, else 'recompute', 'backward', "
      "'offloaded' or 'other'; None where no remat allocator returned it.");
  m.def("name_saved_tensors", &name_saved_tensors, py::arg("named"),
        "Inside a save region: report names for the tensors it is about to save.");

  py::class_<SavedGroup>(m, "SavedGroup")
      .def_readonly("label", &SavedGroup::label)
      .def_readonly("bytes", &SavedGroup::bytes)
      .def_readonly("count", &SavedGroup::count)
      .def_readonly("storages", &SavedGroup::storages)
      .def_readonly("first_member", &SavedGroup::first_member);
  def_report_text(py::class_<SavedReport>(m, "SavedReport")
                      .def_readonly("total_bytes", &SavedReport::total_bytes)
                      .def_readonly("region_bytes", &SavedReport::region_bytes)
                      .def_readonly("outside_bytes", &SavedReport::outside_bytes)
                      .def_readonly("regions", &SavedReport::regions)
                      .def_readonly("region_groups", &SavedReport::region_groups)
                      .def_readonly("node_groups", &SavedReport::node_groups)
                      .def_readonly("details", &SavedReport::details));
  py::class_<SavedTensorsWalk>(m, "SavedTensorsWalk",
                                "A graph walk: inside, reading a tensor a checkpoint dropped raises instead of "
                                "recomputing it, and the checkpoints read are noted.")
      .def(py::init<>())
      .def("__enter__", [](SavedTensorsWalk& walk) { walk.enter(); })
      .def("__exit__", [](SavedTensorsWalk& walk, const py::args&) { walk.exit(); })
      .def(
          "add_node",
          [](SavedTensorsWalk& walk, std::string node, std::uintptr_t id, TensorList tensors) {
            walk.add_node({std::move(node), id, std::move(tensors)});
          },
          py::arg("node"), py::arg("id"), py::arg("tensors"))
      .def("note_live_checkpoints", &SavedTensorsWalk::note_live_checkpoints);
  m.def(
      "saved_report",
      [](const std::optional<at::Tensor>& loss, const SavedTensorsWalk* walk) {
        return saved_report(loss.value_or(at::Tensor()), walk);
      },
      py::arg("loss"), py::arg("walk") = nullptr);
  bind_guard<SavedTensorsTracking>(m, "track_saved_tensors",
                                   "Records tensors autograd saves outside checkpoints, for saved_report().");
  bind_guard<CpuAllocatorGuard>(m, "tag_cpu_tensors",
                                "Allocates CPU tensors through the tagging allocator, so they carry tags.");
  m.def("live_bytes", &live_bytes, py::arg("region_prefix") = "",
        "Requested bytes live under a region (and its nested regions), on every allocator.");
  m.def(
      "dump_header",
      [](const std::string& kind, int schema_version, int device) {
        alloc::JsonWriter json;
        json.begin_object();
        alloc::write_dump_header(json, kind, schema_version, device);
        json.end_object();
        return json.str();
      },
      py::arg("kind"), py::arg("schema_version"), py::arg("device"),
      "The header every dump has (kind, schema_version, producer, created_at, host, pid, rank, device), as JSON.");
  m.def(
      "dump_names",
      [] {
        const auto listed = [](const auto& names) {
          py::list out;
          for (const std::string_view name : names) out.append(py::str(name.data(), name.size()));
          return out;
        };
        const auto mapped = [](const auto& aliases) {
          py::dict out;
          for (const auto& [theirs, ours] : aliases) {
            out[py::str(theirs.data(), theirs.size())] = py::str(ours.data(), ours.size());
          }
          return out;
        };
        py::dict names;
        names["policy"] = listed(alloc::names_of<alloc::Policy>());
        names["phase"] = listed(alloc::names_of<alloc::Phase>());
        names["category"] = listed(alloc::names_of<alloc::Category>());
        names["trace_action"] = listed(alloc::names_of<alloc::TraceAction>());
        names["block_state"] = listed(alloc::names_of<alloc::BlockState>());
        names["torch_trace_action"] = mapped(alloc::kTorchTraceActions);
        names["torch_block_state"] = mapped(alloc::kTorchBlockStates);
        return names;
      },
      "The dumps' vocabulary, the allocator's names of each enum by value, and PyTorch's snapshot "
      "spellings that differ from them (theirs -> ours).");
  m.def(
      "instances_among",
      [](const py::list& objects, const py::type& cls) {
        // In C++: over the collector's objects (over 300,000 once transformers' Llama is imported)
        // a Python loop took a sixth of a second per step profile.
        py::list found;
        auto* wanted = reinterpret_cast<PyTypeObject*>(cls.ptr());
        for (const py::handle object : objects) {
          if (PyType_IsSubtype(Py_TYPE(object.ptr()), wanted)) found.append(object);
        }
        return found;
      },
      py::arg("objects"), py::arg("cls"),
      "The objects whose type is `cls` or a subclass of it, told by type alone: no code of theirs runs.");
  m.def("write_dump", &write_dump, py::arg("path"), py::arg("json"), "Writes a dump atomically.");
  m.def("format_bytes", &alloc::format_bytes, py::arg("bytes"), "Bytes as the allocator's messages write them.");
  m.attr("REGION_SEPARATOR") = std::string(alloc::kRegionSeparator);
  m.def("region_path", &alloc::region_path, py::arg("outer"), py::arg("inner"),
        "A region's path inside another (\"layers.0\" and \"attn\" give \"layers.0::attn\"), as the runtime and the "
        "allocator's tags write it.");
  m.def("oom_dump_path", &alloc::oom_dump_path, py::arg("directory"), py::arg("device"),
        "A new OOM dump's path in `directory`, named as the allocator names its own.");
}
