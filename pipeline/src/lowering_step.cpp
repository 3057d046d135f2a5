// The order PyTorch 2.11's single-stage schedules (ScheduleGPipe, Schedule1F1B) really run:
// their _step_microbatches walk the microbatches by hand and never read pipeline_order, so
// the receives land where those loops post them, not where _add_send_recv would put them.

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>

#include <algorithm>
#include <string>

namespace remat::pipeline {
namespace {

// One rank's actions, with the sends and receives a single-stage loop posts around each compute.
class StepOrder {
 public:
  StepOrder(RankOrder& order, int stage, int stages) : order_(order), stage_(stage), stages_(stages) {}

  void forward(int microbatch) {
    if (stage_ > 0) push(ActionType::recv_f, microbatch);
    push(ActionType::forward, microbatch);
    if (stage_ < stages_ - 1) push(ActionType::send_f, microbatch);
  }

  void backward(int microbatch) {
    if (stage_ < stages_ - 1) push(ActionType::recv_b, microbatch);
    push(ActionType::full_backward, microbatch);
    if (stage_ > 0) push(ActionType::send_b, microbatch);
  }

 private:
  void push(ActionType type, int microbatch) { order_.emplace_back(Action::on(stage_, type, microbatch)); }

  RankOrder& order_;
  int stage_;
  int stages_;
};

}  // namespace

Schedule lower_single_stage_step(ScheduleKind kind, const ScheduleShape& shape) {
  if (kind != ScheduleKind::gpipe && kind != ScheduleKind::one_f_one_b) {
    throw PlanError("the step lowering is the order of PyTorch's single-stage schedules (gpipe, 1f1b), not of " +
                    std::string(to_string(kind)) +
                    ", whose runtime follows its lowered pipeline_order (use the runtime lowering)");
  }
  // The generator checks the shape as PyTorch does (1F1B: microbatches >= stages) and maps stage s to rank s.
  Schedule schedule = generate_schedule(kind, shape);
  const int stages = schedule.num_stages();
  const int microbatches = schedule.microbatches;
  for (int stage = 0; stage < stages; ++stage) {
    RankOrder& order = schedule.ranks[static_cast<std::size_t>(stage)];
    order.clear();
    StepOrder step(order, stage, stages);
    if (kind == ScheduleKind::gpipe) {
      for (int mb = 0; mb < microbatches; ++mb) step.forward(mb);
      for (int mb = 0; mb < microbatches; ++mb) step.backward(mb);
      continue;
    }
    // Schedule1F1B: min(M, S - s) warm-up forwards, then one backward and one forward in turn,
    // then the remaining backwards.
    const int warmup = std::min(microbatches, stages - stage);
    int next_forward = 0;
    int next_backward = 0;
    while (next_forward < warmup) step.forward(next_forward++);
    while (true) {
      step.backward(next_backward++);
      if (next_forward == microbatches) break;
      step.forward(next_forward++);
    }
    while (next_backward < microbatches) step.backward(next_backward++);
  }
  return schedule;
}

}  // namespace remat::pipeline
