// remat._C.KeptOps: the ops a per-op plan keeps in one region of one checkpoint call, carried out
// by the runtime below autograd (remat/kept_ops.hpp; remat/_kept_ops.py drives it).

#include "python_bridge.hpp"

#include <remat/kept_ops.hpp>

#include <pybind11/stl.h>

#include <map>
#include <memory>

namespace remat::python {
namespace {

// `with ops.running(recomputing):` around the region's body.
struct RunningScope {
  std::shared_ptr<KeptOps> ops;
  bool recomputing = false;
  std::unique_ptr<KeptOps::Scope> scope;
};

}  // namespace

void bind_kept_ops(py::module_& m) {
  py::class_<KeptOps, std::shared_ptr<KeptOps>>(
      m, "KeptOps", "The ops a per-op plan keeps in one region of one checkpoint call: {op index: ATen op name}")
      .def(py::init<std::string, std::map<std::uint32_t, std::string>>(), py::arg("region"), py::arg("kept"))
      .def("clear", &KeptOps::clear, "Lets every held output go.")
      .def(
          "running",
          [](const std::shared_ptr<KeptOps>& ops, bool recomputing) {
            return RunningScope{ops, recomputing, nullptr};
          },
          py::arg("recomputing"),
          "A context manager around the region's body: forward's holds the kept ops' outputs, recompute's hands "
          "them back. Leaving it by an exception lets them go; leaving it normally checks forward ran every kept op "
          "(ValueError otherwise).");
  py::class_<RunningScope>(m, "KeptOpsScope")
      .def("__enter__",
           [](RunningScope& running) {
             running.scope = std::make_unique<KeptOps::Scope>(*running.ops, running.recomputing);
           })
      .def("__exit__", [](RunningScope& running, const py::handle& type, const py::handle&, const py::handle&) {
        std::unique_ptr<KeptOps::Scope> scope = std::move(running.scope);
        if (scope && type.is_none()) {
          try {
            scope->finish();
          } catch (const c10::ValueError& error) {
            throw py::value_error(error.what_without_backtrace());
          }
        }
        return false;
      });
  m.def("set_kept_ops_aside", &set_kept_ops_aside, py::arg("aside"),
        "Sets this thread's kept ops aside (True) or back (False), counted: torch.compile's compile hooks.");
  m.def(
      "kept_op_outputs",
      [] {
        py::dict storages;
        for (const HeldOpOutput& held : held_op_outputs())
          storages[py::make_tuple(held.device, held.address)] = held.bytes;
        return storages;
      },
      "{(device, address): bytes} of every op output held for recompute now.");
}

}  // namespace remat::python
