// The passes PyTorch 2.11's _PipelineScheduleRuntime._prepare_schedule_with_comms runs on each
// rank before _add_send_recv: FSDP's UNSHARD/RESHARD and the gradient reduction REDUCE_GRAD.

#include "detail/lowering.hpp"
#include "detail/python_int_set.hpp"

#include <cstddef>
#include <list>
#include <optional>
#include <vector>

namespace remat::pipeline::detail {
namespace {

Action stage_action(int stage, ActionType type) {
  Action action;
  action.stage = stage;
  action.type = type;
  return action;
}

// The stages an action computes on, in order, without repeats.
void stages_of(const Action& action, std::vector<int>& out) {
  out.clear();
  if (action.sub_actions.empty()) {
    out.push_back(action.stage);
    return;
  }
  for (const Action& sub : action.sub_actions) {
    bool seen = false;
    for (const int s : out) seen = seen || s == sub.stage;
    if (!seen) out.push_back(sub.stage);
  }
}

constexpr std::size_t kMaxActiveStages = 3;

// For every step, PyTorch's next_stage_indices(3, order[step:]): the distinct stages of the
// steps ahead in order of first use, up to the step that brings their number to three (an
// OVERLAP_F_B step counts whole, so it can bring it to four). Built from the back with a
// move-to-front list, so each step costs its own stages plus three, not the rest of the order.
std::vector<std::vector<int>> upcoming_stages(const RankOrder& order, int num_stages) {
  struct Entry {
    int stage;
    std::size_t first_step;  // the step at which this stage is first used, counting from here
  };
  std::list<Entry> recency;
  std::vector<std::list<Entry>::iterator> where(static_cast<std::size_t>(num_stages), recency.end());
  std::vector<std::vector<int>> upcoming(order.size());
  std::vector<int> stages;
  for (std::size_t step = order.size(); step-- > 0;) {
    if (!order[step]) continue;
    stages_of(*order[step], stages);
    for (auto s = stages.rbegin(); s != stages.rend(); ++s) {
      auto& it = where[static_cast<std::size_t>(*s)];
      if (it != recency.end()) recency.erase(it);
      recency.push_front({*s, step});
      it = recency.begin();
    }
    std::vector<int>& next = upcoming[step];
    for (auto it = recency.begin(); it != recency.end();) {
      const std::size_t group = it->first_step;
      while (it != recency.end() && it->first_step == group) next.push_back((it++)->stage);
      if (next.size() >= kMaxActiveStages) break;
    }
  }
  return upcoming;
}

bool contains(const std::vector<int>& values, int value) {
  for (const int v : values) {
    if (v == value) return true;
  }
  return false;
}

}  // namespace

RankOrder add_unshard_reshard(const RankOrder& order, int num_stages) {
  const std::vector<std::vector<int>> upcoming = upcoming_stages(order, num_stages);
  PythonIntSet active;
  RankOrder out;
  for (std::size_t step = 0; step < order.size(); ++step) {
    if (!order[step]) continue;
    const std::vector<int>& next = upcoming[step];
    std::vector<int> fetch;
    for (const int s : next) {
      if (!active.contains(s)) fetch.push_back(s);
    }
    for (const int s : active.in_iteration_order()) {
      if (contains(next, s)) continue;
      active.discard(s);
      out.emplace_back(stage_action(s, ActionType::reshard));
    }
    for (const int s : fetch) {
      active.add(s);
      out.emplace_back(stage_action(s, ActionType::unshard));
    }
    out.push_back(order[step]);
  }
  for (const int s : active.in_iteration_order()) {
    active.discard(s);
    out.emplace_back(stage_action(s, ActionType::reshard));
  }
  return out;
}

RankOrder add_reduce_grad(const RankOrder& order, int num_stages, int microbatches) {
  std::vector<int> gradients(static_cast<std::size_t>(num_stages), 0);
  RankOrder out;
  std::vector<int> finished;
  for (const std::optional<Action>& step : order) {
    if (!step) continue;
    out.push_back(step);
    finished.clear();
    auto count = [&](const Action& leaf) {
      if (leaf.type != ActionType::backward_weight && leaf.type != ActionType::full_backward) return;
      if (++gradients[static_cast<std::size_t>(leaf.stage)] == microbatches) finished.push_back(leaf.stage);
    };
    if (step->sub_actions.empty()) {
      count(*step);
    } else {
      for (const Action& sub : step->sub_actions) count(sub);
    }
    for (const int s : finished) out.emplace_back(stage_action(s, ActionType::reduce_grad));
  }
  return out;
}

}  // namespace remat::pipeline::detail
