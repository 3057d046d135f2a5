// remat.RecomputeReplay and remat.RecomputeReplayRecorder: the runtime's record/replay channel
// with its thread-local binding, holding Python objects as decisions.

#include "python_bridge.hpp"

#include <remat/replay.hpp>

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace remat::python {
namespace {

// The tensors of a decision (itself, or the items of its tuples, lists and dicts, nested) with
// their version counters when it was recorded (inference tensors have none).
using TensorVersions = std::vector<std::pair<at::Tensor, std::uint32_t>>;

constexpr int kDecisionDepth = 16;

void add_tensors(const py::handle& value, TensorVersions& tensors, int depth) {
  if (THPVariable_Check(value.ptr())) {
    const at::Tensor& tensor = THPVariable_Unpack(value.ptr());
    if (tensor.defined() && !tensor.is_inference()) tensors.emplace_back(tensor, tensor._version());
  } else if (depth < kDecisionDepth && (PyTuple_Check(value.ptr()) || PyList_Check(value.ptr()))) {
    for (const py::handle item : value) add_tensors(item, tensors, depth + 1);
  } else if (depth < kDecisionDepth && PyDict_Check(value.ptr())) {
    for (const auto item : py::reinterpret_borrow<py::dict>(value)) add_tensors(item.second, tensors, depth + 1);
  }
}

TensorVersions tensors_of(const py::handle& value) {
  TensorVersions tensors;
  add_tensors(value, tensors, 0);
  return tensors;
}

// A recorded decision, with its tensors' versions when it was recorded.
struct Decision {
  PyRef value;
  TensorVersions tensors;
};

using Recorder = RecomputeReplayRecorder<Decision>;
using Channel = RecomputeReplay<Decision>;

Decision decision_of(const py::object& value) { return {PyRef(value), tensors_of(value)}; }

// A tensor decision changed in place after forward (ids += offset), or a container decision
// whose tensors were replaced, would come back changed and recompute would run on other values
// than forward did: that is refused.
const py::object& checked_value(const Decision& decision, const std::string& channel) {
  const py::object& value = decision.value.get();
  const TensorVersions now = tensors_of(value);
  const std::string where = "replay channel '" + channel + "': ";
  for (std::size_t i = 0; i < decision.tensors.size() && i < now.size(); ++i) {
    const auto& [tensor, version] = decision.tensors[i];
    if (!now[i].first.is_same(tensor)) break;
    if (now[i].second == version) continue;
    const std::string which = now.size() == 1 ? "the tensor" : "tensor " + std::to_string(i) + " of the value";
    throw Error(where + which + " recorded in forward was changed in place afterwards (version " +
                std::to_string(version) + ", now " + std::to_string(now[i].second) +
                "), so replay would hand back the changed value: make that operation out-of-place (ids = ids + "
                "offset), or return a copy from compute");
  }
  const bool same = now.size() == decision.tensors.size() &&
                    std::equal(now.begin(), now.end(), decision.tensors.begin(),
                               [](const auto& a, const auto& b) { return a.first.is_same(b.first); });
  if (!same) {
    throw Error(where +
                "the list or dict recorded in forward was changed afterwards (its tensors replaced, added or "
                "removed), so replay would hand back the changed value: record a tuple, or return a copy from compute");
  }
  return value;
}

std::string thread_text(std::thread::id id) {
  std::ostringstream out;
  out << id;
  return out.str();
}

ReplayMode mode_of(const std::string& channel, const std::string& mode) {
  if (mode == "record") return ReplayMode::record;
  if (mode == "replay") return ReplayMode::replay;
  throw py::value_error(invalid_replay_mode(channel, mode));
}

// channel.scope(recorder, mode) as a context manager: binds on the thread that enters it and
// must exit there (bindings are thread-local).
class ScopeGuard {
 public:
  ScopeGuard(py::object channel, std::shared_ptr<Recorder> recorder, const std::string& mode)
      : channel_(std::move(channel)), recorder_(std::move(recorder)), mode_(mode) {
    mode_of(channel_.cast<const Channel&>().name(), mode_);
  }
  void enter() {
    if (scope_) throw Error("replay scope: entered twice; make a new scope with channel.scope(recorder, mode)");
    scope_.emplace(channel_.cast<const Channel&>().scope(recorder_, mode_));
    thread_ = std::this_thread::get_id();
  }
  void exit() {
    if (!scope_) throw Error("replay scope: exited without being entered");
    if (thread_ != std::this_thread::get_id()) {
      throw Error("replay channel '" + channel_.cast<const Channel&>().name() + "': a scope entered on thread " +
                  thread_text(thread_) + " was exited on thread " + thread_text(std::this_thread::get_id()) +
                  "; bindings are per thread, so exit it where it was entered");
    }
    scope_.reset();
  }

 private:
  py::object channel_;  // keeps the channel alive while bound
  std::shared_ptr<Recorder> recorder_;
  std::string mode_;
  std::optional<Channel::Scope> scope_;
  std::thread::id thread_;
};

}  // namespace

CheckpointContextFactory replay_context_factory(const py::handle& context) {
  if (!py::isinstance<Channel>(context)) return {};
  // The factory keeps the Python object, and so the channel, alive as long as the checkpoint.
  return [keep = PyRef(py::reinterpret_borrow<py::object>(context)),
          factory = context.cast<const Channel&>().context_factory()] { return factory(); };
}

void bind_replay(py::module_& m) {
  py::class_<Recorder, std::shared_ptr<Recorder>>(m, "RecomputeReplayRecorder",
                                                  "The ordered decisions of one checkpoint call.")
      .def(py::init<>())
      .def("record", [](Recorder& recorder, const py::object& entry) { recorder.record(decision_of(entry)); },
           py::arg("entry"), "Appends one forward decision.")
      .def(
          "take",
          [](Recorder& recorder) -> py::object {
            std::optional<Decision> entry = recorder.take();
            if (!entry) return py::none();
            return checked_value(*entry, recorder.channel().empty() ? "?" : recorder.channel());
          },
          "The next recorded decision, or None when replay outran the log (counted in replay_misses).")
      .def("rewind", &Recorder::rewind, "Replay starts again from the first record.")
      .def_property_readonly(
          "records",
          [](const Recorder& recorder) {
            py::tuple out(recorder.size());
            for (std::size_t i = 0; i < recorder.size(); ++i) out[i] = recorder.records()[i].value.get();
            return out;
          },
          "The recorded decisions, in forward order.")
      .def_property_readonly("replay_misses", &Recorder::replay_misses)
      .def("__len__", &Recorder::size);

  py::class_<ScopeGuard>(m, "ReplayScope")
      .def("__enter__", [](ScopeGuard& guard) { guard.enter(); })
      .def("__exit__", [](ScopeGuard& guard, const py::args&) { guard.exit(); });

  py::class_<Channel>(m, "RecomputeReplay", "Decisions forward records and recompute takes back in order.")
      .def(py::init<std::string>(), py::arg("name"))
      .def_property_readonly("name", &Channel::name)
      .def(
          "current",
          [](const Channel& channel) -> py::object {
            const std::optional<Channel::Binding> binding = channel.current();
            if (!binding) return py::none();
            return py::make_tuple(binding->recorder, binding->mode == ReplayMode::record ? "record" : "replay");
          },
          "The (recorder, mode) bound on this thread, or None outside a scope.")
      .def(
          "scope",
          [](const py::object& channel, std::shared_ptr<Recorder> recorder, const std::string& mode) {
            return ScopeGuard(channel, std::move(recorder), mode);
          },
          py::arg("recorder").none(true), py::arg("mode"),
          "Binds recorder in mode (\"record\" or \"replay\") on this thread for a with block; recorder=None disables "
          "replay inside.")
      .def(
          "record_or_replay",
          [](const Channel& channel, const py::object& compute) -> py::object {
            const Decision decision = channel.record_or_replay([&] { return decision_of(compute()); });
            return checked_value(decision, channel.name());
          },
          py::arg("compute"),
          "Under replay, the recorded value (compute() when the log ran out); under record, compute() recorded; "
          "elsewhere compute(). compute() runs without autograd.");
}

}  // namespace remat::python
