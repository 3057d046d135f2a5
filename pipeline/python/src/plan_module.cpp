// remat._pipeline_plan: remat::pipeline_plan for remat.pipelining, so that the rings of a
// torch.distributed.pipelining schedule come from the same planner as `remat-report plan`.
// Standard C++ over pybind11's headers; no LibTorch.

#include <remat/pipeline/action.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/plan.hpp>
#include <remat/pipeline/predict.hpp>
#include <remat/pipeline/ring.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace remat::pipeline {
namespace {

using TextOrder = std::vector<std::optional<std::string>>;

Schedule schedule_of(const std::vector<TextOrder>& orders, const std::vector<int>& stage_to_rank, int microbatches) {
  Schedule schedule;
  schedule.stage_to_rank = stage_to_rank;
  schedule.microbatches = microbatches;
  for (std::size_t rank = 0; rank < orders.size(); ++rank) {
    RankOrder order;
    for (std::size_t position = 0; position < orders[rank].size(); ++position) {
      const std::optional<std::string>& text = orders[rank][position];
      if (!text) {
        order.emplace_back(std::nullopt);
        continue;
      }
      try {
        order.push_back(parse_action(*text));
      } catch (const PlanError& e) {
        throw PlanError("rank " + std::to_string(rank) + ", position " + std::to_string(position) + ": " + e.what());
      }
    }
    schedule.ranks.push_back(std::move(order));
  }
  return schedule;
}

// The pipeline-plan dump of a lowered schedule given as each rank's actions in PyTorch's text.
std::string plan_json(const std::vector<TextOrder>& orders, const std::vector<int>& stage_to_rank, int microbatches,
                      const std::string& schedule, const std::string& lowering, int slack, int spare_sets,
                      bool use_closed_form, std::optional<std::uint64_t> buffer_bytes) {
  PlanOptions options;
  options.schedule_name = schedule;
  options.lowering = lowering;
  options.slack = slack;
  options.spare_sets = spare_sets;
  options.use_closed_form = use_closed_form;
  options.buffer_bytes = buffer_bytes;
  return plan_to_json(plan_receive_buffers(schedule_of(orders, stage_to_rank, microbatches), options));
}

// What ScheduleGPipe or Schedule1F1B runs, rank by rank, in PyTorch's text.
std::vector<std::vector<std::string>> step_order(const std::string& schedule, int stages, int microbatches) {
  const std::optional<ScheduleKind> kind = parse_schedule_kind(schedule);
  if (!kind) throw PlanError("unknown schedule '" + schedule + "'; the step order exists for gpipe and 1f1b");
  ScheduleShape shape;
  shape.ranks = stages;
  shape.microbatches = microbatches;
  const Schedule lowered = lower_single_stage_step(*kind, shape);
  std::vector<std::vector<std::string>> orders;
  for (const RankOrder& order : lowered.ranks) {
    std::vector<std::string>& texts = orders.emplace_back();
    for (const std::optional<Action>& action : order) texts.push_back(to_string(*action));
  }
  return orders;
}

// A generated schedule's lowered order, each rank's actions in PyTorch's text, and its stage-to-rank
// mapping: "step" as ScheduleGPipe/Schedule1F1B run it, "runtime" as the action runtime runs it,
// "add-send-recv" as _add_send_recv lowers it.
std::pair<std::vector<std::vector<std::string>>, std::vector<int>> lowered_order(const std::string& schedule, int ranks,
                                                                                 int microbatches,
                                                                                 std::optional<int> virtual_stages,
                                                                                 const std::string& lowering) {
  const std::optional<ScheduleKind> kind = parse_schedule_kind(schedule);
  if (!kind) throw PlanError("unknown schedule '" + schedule + "'; give one remat-report schedule names");
  ScheduleShape shape;
  shape.ranks = ranks;
  shape.microbatches = microbatches;
  shape.virtual_stages = virtual_stages;
  Schedule lowered;
  if (lowering == "step") {
    lowered = lower_single_stage_step(*kind, shape);
  } else if (lowering == "runtime") {
    lowered = lower_schedule_for_runtime(generate_schedule(*kind, shape));
  } else if (lowering == "add-send-recv") {
    lowered = lower_schedule(generate_schedule(*kind, shape));
  } else {
    throw PlanError("lowering '" + lowering + "'; give step, runtime or add-send-recv");
  }
  std::vector<std::vector<std::string>> orders;
  for (const RankOrder& order : lowered.ranks) {
    std::vector<std::string>& texts = orders.emplace_back();
    for (const std::optional<Action>& action : order) texts.push_back(action ? to_string(*action) : "");
  }
  return {orders, lowered.stage_to_rank};
}

// The stage_profile dump of the figures remat.pipelining.profile_stage measured.
std::string stage_profile_json(const std::string& model, int stage, int num_stages, const std::string& device_name,
                               const std::map<std::string, std::uint64_t>& bytes) {
  return stage_profile_to_json(stage_profile_of(model, stage, num_stages, device_name, bytes));
}

// The pipeline_prediction dump for stage profiles (their JSON text) over a lowered schedule.
std::string predict_json(const std::vector<TextOrder>& orders, const std::vector<int>& stage_to_rank, int microbatches,
                         const std::vector<std::string>& profiles, const std::string& schedule,
                         const std::string& lowering, const std::string& buffers, int spare_sets, int slack,
                         bool optimizer_step) {
  if (buffers != "stock" && buffers != "pooled") {
    throw PlanError("buffers is '" + buffers + "'; give \"stock\" (one set per microbatch) or \"pooled\" (the plan's rings)");
  }
  std::vector<StageProfile> read;
  for (std::size_t i = 0; i < profiles.size(); ++i) {
    read.push_back(stage_profile_from_json(profiles[i], "profiles[" + std::to_string(i) + "]"));
  }
  std::sort(read.begin(), read.end(), [](const StageProfile& a, const StageProfile& b) { return a.stage < b.stage; });
  PredictOptions options;
  options.schedule_name = schedule;
  options.lowering = lowering;
  options.buffers = buffers == "stock" ? ReceiveBuffers::stock : ReceiveBuffers::pooled;
  options.spare_sets = spare_sets;
  options.slack = slack;
  options.optimizer_step = optimizer_step;
  return prediction_to_json(predict_peaks(schedule_of(orders, stage_to_rank, microbatches), read, options));
}

}  // namespace
}  // namespace remat::pipeline

PYBIND11_MODULE(_pipeline_plan, module) {
  module.doc() = "Receive-buffer plans of remat::pipeline_plan, for remat.pipelining";
  py::register_exception<remat::pipeline::PlanError>(module, "PlanError", PyExc_ValueError);
  module.def("plan_json", &remat::pipeline::plan_json, py::arg("orders"), py::arg("stage_to_rank"),
             py::arg("microbatches"), py::kw_only(), py::arg("schedule") = "", py::arg("lowering") = "",
             py::arg("slack") = 2, py::arg("spare_sets") = 0, py::arg("use_closed_form") = true,
             py::arg("buffer_bytes") = py::none(),
             "The pipeline-plan dump (JSON text) of a lowered schedule: orders[rank] holds that rank's actions "
             "in PyTorch's text ('1RECV_F0', '1F0', None for an idle step).");
  module.def("schedule_supports_recv_pool", &remat::pipeline::schedule_supports_recv_pool, py::arg("name"),
             "NeMo's gate for its closed-form ring: true for '1f1b' in any letter case only.");
  module.def("nemo_ring_size", &remat::pipeline::nemo_ring_size, py::arg("stages"), py::arg("stage_index"),
             py::arg("microbatches"), py::arg("slack"), "NeMo's ring: max(2, min(M, S - s + slack)).");
  module.def("lowered_order", &remat::pipeline::lowered_order, py::arg("schedule"), py::arg("ranks"),
             py::arg("microbatches"), py::arg("virtual_stages") = py::none(), py::arg("lowering") = "runtime",
             "(orders, stage_to_rank) of a generated schedule, lowered as `remat-report schedule --lowered` does.");
  module.def("stage_profile_json", &remat::pipeline::stage_profile_json, py::arg("model"), py::arg("stage"),
             py::arg("num_stages"), py::arg("device_name"), py::arg("bytes"),
             "The stage_profile dump (JSON text) of a stage's measured byte figures.");
  module.def("predict_json", &remat::pipeline::predict_json, py::arg("orders"), py::arg("stage_to_rank"),
             py::arg("microbatches"), py::arg("profiles"), py::kw_only(), py::arg("schedule") = "",
             py::arg("lowering") = "", py::arg("buffers") = "stock", py::arg("spare_sets") = 0, py::arg("slack") = 2,
             py::arg("optimizer_step") = true,
             "The pipeline_prediction dump (JSON text): each rank's predicted peak for stage profiles (stage_profile "
             "dumps' text) over a lowered schedule given as each rank's actions in PyTorch's text.");
  module.def("step_order", &remat::pipeline::step_order, py::arg("schedule"), py::arg("stages"),
             py::arg("microbatches"),
             "What ScheduleGPipe ('gpipe') or Schedule1F1B ('1f1b') runs on each rank, SEND/RECV included.");
}
