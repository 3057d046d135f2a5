// remat._pipeline_plan: remat::pipeline_plan for remat.pipelining, so that the rings of a
// torch.distributed.pipelining schedule come from the same planner as `remat-report plan`.
// Standard C++ over pybind11's headers; no LibTorch.

#include <remat/pipeline/action.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/plan.hpp>
#include <remat/pipeline/ring.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
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
  module.def("step_order", &remat::pipeline::step_order, py::arg("schedule"), py::arg("stages"),
             py::arg("microbatches"),
             "What ScheduleGPipe ('gpipe') or Schedule1F1B ('1f1b') runs on each rank, SEND/RECV included.");
}
