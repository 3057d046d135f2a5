// Two stages per rank in a V (rank r holds stages r and 2R-1-r): ZBV Zero Bubble and
// DualPipeV, as PyTorch 2.11 orders them.

#include "detail/generators.hpp"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>

namespace remat::pipeline::detail {
namespace {

// One rank of ZBV. The order is built for at least 2R-1 microbatches, the fewest that fill
// the V, and the actions on microbatches beyond the real count become idle steps.
RankOrder zbv_rank_order(int rank, int ranks, int microbatches) {
  const int built = std::max(2 * ranks - 1, microbatches);
  const int down = rank;                // the stage on the way down the V
  const int up = 2 * ranks - 1 - rank;  // the stage on the way back up
  int f_down = 0, f_up = 0, b_down = 0, b_up = 0;
  RankOrder order(static_cast<std::size_t>(rank));
  auto add = [&](int stage, ActionType type, int mb) { order.emplace_back(Action::on(stage, type, mb)); };
  auto backward_and_weight = [&](int stage, int& counter) {
    add(stage, ActionType::backward_input, counter);
    add(stage, ActionType::backward_weight, counter);
    ++counter;
  };

  for (int i = 0; i < 2 * (ranks - rank) - 1; ++i) add(down, ActionType::forward, f_down++);
  for (int i = 0; i < rank; ++i) {
    add(up, ActionType::forward, f_up++);
    add(down, ActionType::forward, f_down++);
  }
  for (int i = 0; i < ranks - rank; ++i) {
    add(up, ActionType::forward, f_up++);
    backward_and_weight(up, b_up);
  }
  while (f_up < f_down || f_down < built) {
    if (f_down < built) add(down, ActionType::forward, f_down++);
    backward_and_weight(down, b_down);
    add(up, ActionType::forward, f_up++);
    backward_and_weight(up, b_up);
  }
  int w_down = b_down, w_up = b_up;
  for (int i = 0; i < rank; ++i) {
    add(down, ActionType::backward_input, b_down++);
    add(up, ActionType::backward_input, b_up++);
  }
  for (int i = 0; i < ranks - rank; ++i) {
    add(down, ActionType::backward_input, b_down++);
    add(down, ActionType::backward_weight, w_down++);
  }
  while (w_up < b_up) add(up, ActionType::backward_weight, w_up++);
  while (w_down < b_down) add(down, ActionType::backward_weight, w_down++);

  for (std::optional<Action>& action : order) {
    if (action && *action->microbatch >= microbatches) action.reset();
  }
  return order;
}

// One rank of DualPipeV. Microbatch numbers come from per-stage counters: forwards count F,
// and B and I share one backward counter; every I queues its W, which runs later in the order
// the I's ran.
class DualPipeVRank {
 public:
  DualPipeVRank(int rank, int ranks) : rank_(rank), ranks_(ranks), down_(rank), up_(2 * ranks - 1 - rank) {}

  RankOrder build(int microbatches) {
    for (int i = 0; i < 2 * (ranks_ - rank_ - 1); ++i) single(down_, ActionType::forward);
    for (int i = 0; i < rank_ + 1; ++i) {
      single(down_, ActionType::forward);
      single(up_, ActionType::forward);
    }
    for (int i = 0; i < ranks_ - rank_ - 1; ++i) {
      single(up_, ActionType::backward_input);
      weight_if_pending();
      single(up_, ActionType::forward);
    }
    const int steady = microbatches - 2 * ranks_ + rank_ + 1;
    for (int i = 0; i < steady; ++i) {
      if (i == 0 && rank_ == ranks_ - 1) {
        // The last rank runs its first pair apart, which shortens the bubble.
        single(down_, ActionType::forward);
        single(up_, ActionType::full_backward);
      } else {
        overlapped(down_, up_);
      }
      overlapped(up_, down_);
    }
    for (int i = 0; i < ranks_ - rank_ - 1; ++i) {
      single(up_, ActionType::full_backward);
      overlapped(up_, down_);
    }
    // The second half of the drain splits backwards into I and W (zero bubble); odd ranks
    // switch one backward earlier than even ones.
    bool split = false;
    const int drain = rank_ + 1;
    for (int i = 0; i < drain; ++i) {
      if (i == drain / 2 && rank_ % 2 == 1) split = true;
      single(up_, split ? ActionType::backward_input : ActionType::full_backward);
      if (i == drain / 2 && rank_ % 2 == 0) split = true;
      single(down_, split ? ActionType::backward_input : ActionType::full_backward);
    }
    for (int i = 0; i < ranks_ - rank_ - 1; ++i) {
      weight_if_pending();
      single(down_, split ? ActionType::backward_input : ActionType::full_backward);
    }
    for (int i = 0; i < rank_ + 1; ++i) weight_if_pending();
    return std::move(order_);
  }

 private:
  int& forwards(int stage) { return stage == down_ ? forward_down_ : forward_up_; }
  int& backwards(int stage) { return stage == down_ ? backward_down_ : backward_up_; }

  void single(int stage, ActionType type) {
    if (type == ActionType::forward) {
      order_.emplace_back(Action::on(stage, type, forwards(stage)++));
      return;
    }
    const int mb = backwards(stage)++;
    order_.emplace_back(Action::on(stage, type, mb));
    if (type == ActionType::backward_input) pending_weights_.emplace_back(stage, mb);
  }

  void overlapped(int forward_stage, int backward_stage) {
    Action container;
    container.stage = -1;
    container.type = ActionType::overlap_f_b;
    container.sub_actions.push_back(Action::on(forward_stage, ActionType::forward, forwards(forward_stage)++));
    container.sub_actions.push_back(
        Action::on(backward_stage, ActionType::full_backward, backwards(backward_stage)++));
    order_.emplace_back(std::move(container));
  }

  void weight_if_pending() {
    if (pending_weights_.empty()) return;
    const auto [stage, mb] = pending_weights_.front();
    pending_weights_.pop_front();
    order_.emplace_back(Action::on(stage, ActionType::backward_weight, mb));
  }

  int rank_;
  int ranks_;
  int down_;
  int up_;
  int forward_down_ = 0, forward_up_ = 0, backward_down_ = 0, backward_up_ = 0;
  std::deque<std::pair<int, int>> pending_weights_;
  RankOrder order_;
};

}  // namespace

Schedule zbv_zero_bubble(int ranks, int microbatches) {
  Schedule schedule = make_schedule(ranks, v_stage_to_rank(ranks, 2 * ranks), microbatches);
  for (int rank = 0; rank < ranks; ++rank) {
    schedule.ranks[static_cast<std::size_t>(rank)] = zbv_rank_order(rank, ranks, microbatches);
  }
  return schedule;
}

Schedule dualpipev(int ranks, int microbatches) {
  Schedule schedule = make_schedule(ranks, v_stage_to_rank(ranks, 2 * ranks), microbatches);
  for (int rank = 0; rank < ranks; ++rank) {
    schedule.ranks[static_cast<std::size_t>(rank)] = DualPipeVRank(rank, ranks).build(microbatches);
  }
  return schedule;
}

}  // namespace remat::pipeline::detail
