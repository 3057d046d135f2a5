// Several stages per rank, stage s on rank s % R: Looped BFS, Interleaved 1F1B and
// Interleaved Zero Bubble (ZB1P), as PyTorch 2.11 orders them.

#include <remat/pipeline/errors.hpp>

#include "detail/generators.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>

namespace remat::pipeline::detail {
namespace {

// The shape of one rank's interleaved order: how many forwards run before the first backward
// (warm-up), how many steps pair a forward with a backward, and which local stage a step uses.
// Under zero bubble a rank's W lags `rank` backwards behind its I.
struct InterleavedPlan {
  int rank = 0;
  int ranks = 0;
  int virtual_stages = 0;
  int microbatches_per_round = 0;
  int warmup = 0;
  int paired = 0;  // steps with one forward and one backward
  int idle_after_warmup = 0;
  bool zero_bubble = false;

  int forward_stage(int step) const { return ((step / microbatches_per_round) % virtual_stages) * ranks + rank; }
  int backward_stage(int step) const {
    return (virtual_stages - 1 - ((step - warmup) / microbatches_per_round) % virtual_stages) * ranks + rank;
  }
};

InterleavedPlan plan_rank(int rank, int ranks, int virtual_stages, int microbatches, bool zero_bubble) {
  InterleavedPlan plan;
  plan.rank = rank;
  plan.ranks = ranks;
  plan.virtual_stages = virtual_stages;
  const int rounds = std::max(1, microbatches / ranks);
  plan.microbatches_per_round = microbatches / rounds;
  // The last rank warms up the other local stages of one round; each hop towards rank 0 adds
  // two forwards (one under zero bubble), never more than all of this rank's forwards.
  const int hop_factor = zero_bubble ? 1 : 2;
  const int total = virtual_stages * microbatches;
  plan.warmup = std::min((virtual_stages - 1) * plan.microbatches_per_round + hop_factor * (ranks - 1 - rank), total);
  plan.paired = total - plan.warmup;
  // Idle until the first backward can arrive: it leaves the last stage after V*R forward
  // steps and climbs two steps per rank (zero bubble: the warm-up is shorter by the hops).
  plan.idle_after_warmup = zero_bubble
                               ? ranks - rank - 1
                               : std::max(0, virtual_stages * ranks + 2 * (ranks - 1 - rank) - (plan.warmup + rank));
  plan.zero_bubble = zero_bubble;
  return plan;
}

// The shared warm-up / 1F1B / cool-down walk of PyTorch's _get_1f1b_rank_ops.
RankOrder interleaved_rank_order(const InterleavedPlan& plan, int num_stages) {
  std::vector<int> next_forward(static_cast<std::size_t>(num_stages), 0);
  std::vector<int> next_backward(static_cast<std::size_t>(num_stages), 0);
  std::vector<int> next_weight(static_cast<std::size_t>(num_stages), 0);
  std::vector<int> backward_steps;  // the step of every backward so far, for the W that follows it
  std::size_t weights_done = 0;
  const ActionType backward_type = plan.zero_bubble ? ActionType::backward_input : ActionType::full_backward;

  RankOrder order;
  idle(order, plan.rank);
  auto forward = [&](int step) {
    const int stage = plan.forward_stage(step);
    order.emplace_back(Action::on(stage, ActionType::forward, next_forward[static_cast<std::size_t>(stage)]++));
  };
  auto backward = [&](int step) {
    const int stage = plan.backward_stage(step);
    order.emplace_back(Action::on(stage, backward_type, next_backward[static_cast<std::size_t>(stage)]++));
    backward_steps.push_back(step);
  };
  auto weight = [&] {
    const int stage = plan.backward_stage(backward_steps[weights_done++]);
    order.emplace_back(
        Action::on(stage, ActionType::backward_weight, next_weight[static_cast<std::size_t>(stage)]++));
  };
  auto weight_if_due = [&](int step) {
    if (plan.zero_bubble && step - plan.warmup >= plan.rank) weight();
  };

  const int steps = plan.warmup + plan.paired + plan.warmup;  // the cool-down is as long as the warm-up
  for (int step = 0; step < steps; ++step) {
    if (step < plan.warmup) {
      forward(step);
      if (step == plan.warmup - 1) idle(order, plan.idle_after_warmup);
    } else if (step < plan.warmup + plan.paired) {
      forward(step);
      backward(step);
      weight_if_due(step);
    } else {
      if (!plan.zero_bubble) order.emplace_back(std::nullopt);
      backward(step);
      weight_if_due(step);
    }
  }
  while (plan.zero_bubble && weights_done < backward_steps.size()) weight();
  return order;
}

// ScheduleInterleavedZeroBubble._add_bubbles_to_actions: replay the ranks in lock step and
// hold a rank (an idle step) whose next F needs the previous stage's F, or whose next B needs
// the next stage's B, from a step that has not happened yet.
void add_bubbles(Schedule& schedule) {
  const int num_stages = schedule.num_stages();
  const int microbatches = schedule.microbatches;
  const auto index = [&](int stage, int mb) {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(microbatches) + static_cast<std::size_t>(mb);
  };
  const std::size_t cells = static_cast<std::size_t>(num_stages) * static_cast<std::size_t>(microbatches);
  std::vector<char> forward_seen(cells, 0);
  std::vector<char> backward_seen(cells, 0);

  auto needs_bubble = [&](const Action& a) {
    const int mb = *a.microbatch;
    if (a.type == ActionType::forward) return a.stage != 0 && !forward_seen[index(a.stage - 1, mb)];
    if (a.type == ActionType::full_backward) {
      if (a.stage == num_stages - 1) return !forward_seen[index(a.stage, mb)];
      return !backward_seen[index(a.stage + 1, mb)];
    }
    return false;
  };

  const std::size_t ranks = schedule.ranks.size();
  std::vector<RankOrder> result(ranks);
  std::vector<std::size_t> next(ranks, 0);
  std::vector<const Action*> seen_this_step;
  while (true) {
    bool any_left = false;
    bool advanced = false;
    seen_this_step.clear();
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      const RankOrder& order = schedule.ranks[rank];
      if (next[rank] >= order.size()) continue;
      any_left = true;
      const std::optional<Action>& action = order[next[rank]];
      if (action && needs_bubble(*action)) {
        result[rank].emplace_back(std::nullopt);
        continue;
      }
      result[rank].push_back(action);
      if (action) seen_this_step.push_back(&*action);
      ++next[rank];
      advanced = true;
    }
    for (const Action* a : seen_this_step) {
      if (a->type == ActionType::forward) forward_seen[index(a->stage, *a->microbatch)] = 1;
      if (a->type == ActionType::full_backward) backward_seen[index(a->stage, *a->microbatch)] = 1;
    }
    if (!any_left) break;
    if (!advanced) {
      // PyTorch would loop forever here; no shape it accepts gets here.
      throw PlanError("interleaved zero bubble: the generated order cannot make progress (internal error)");
    }
  }
  schedule.ranks = std::move(result);
}

Schedule interleaved(int ranks, int virtual_stages, int microbatches, bool zero_bubble) {
  Schedule schedule = make_schedule(ranks, loop_stage_to_rank(ranks, ranks * virtual_stages), microbatches);
  for (int rank = 0; rank < ranks; ++rank) {
    schedule.ranks[static_cast<std::size_t>(rank)] = interleaved_rank_order(
        plan_rank(rank, ranks, virtual_stages, microbatches, zero_bubble), schedule.num_stages());
  }
  return schedule;
}

}  // namespace

Schedule looped_bfs(int ranks, int virtual_stages, int microbatches) {
  Schedule schedule = make_schedule(ranks, loop_stage_to_rank(ranks, ranks * virtual_stages), microbatches);
  for (int rank = 0; rank < ranks; ++rank) {
    RankOrder& order = schedule.ranks[static_cast<std::size_t>(rank)];
    idle(order, rank);
    for (int local = 0; local < virtual_stages; ++local) {
      for (int mb = 0; mb < microbatches; ++mb) {
        order.emplace_back(Action::on(local * ranks + rank, ActionType::forward, mb));
      }
    }
    idle(order, 2 * (ranks - 1 - rank));
    for (int local = virtual_stages - 1; local >= 0; --local) {
      for (int mb = microbatches - 1; mb >= 0; --mb) {
        order.emplace_back(Action::on(local * ranks + rank, ActionType::full_backward, mb));
      }
    }
  }
  return schedule;
}

Schedule interleaved_1f1b(int ranks, int virtual_stages, int microbatches) {
  return interleaved(ranks, virtual_stages, microbatches, /*zero_bubble=*/false);
}

Schedule interleaved_zero_bubble(int ranks, int virtual_stages, int microbatches) {
  Schedule schedule = interleaved(ranks, virtual_stages, microbatches, /*zero_bubble=*/true);
  add_bubbles(schedule);
  return schedule;
}

}  // namespace remat::pipeline::detail
