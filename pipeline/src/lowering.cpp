#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/lowering.hpp>

#include "detail/lowering.hpp"

#include <cstdint>
#include <set>
#include <string>

namespace remat::pipeline {
namespace detail {
namespace {

// What each rank has done so far, as PyTorch's prev_actions sets: a stage lives on one rank,
// so one flag array indexed by stage and microbatch serves every rank.
class Progress {
 public:
  enum Flag : std::uint8_t { forward_done = 1, backward_done = 2, forward_received = 4, backward_received = 8 };

  Progress(const std::vector<int>& stage_to_rank, int microbatches)
      : stage_to_rank_(stage_to_rank),
        microbatches_(microbatches),
        flags_(stage_to_rank.size() * static_cast<std::size_t>(microbatches), 0) {}

  int num_stages() const { return static_cast<int>(stage_to_rank_.size()); }
  int rank_of(int stage) const { return stage_to_rank_[static_cast<std::size_t>(stage)]; }
  void set(int stage, int mb, Flag flag) { flags_[index(stage, mb)] |= flag; }
  bool has(int stage, int mb, Flag flag) const { return (flags_[index(stage, mb)] & flag) != 0; }

  // PyTorch's _has_comms: the next (F) or previous (B, I) stage runs on another rank.
  bool sends(const Action& a) const {
    if (a.type == ActionType::forward) return a.stage != num_stages() - 1 && rank_of(a.stage + 1) != rank_of(a.stage);
    if (is_backward(a.type)) return a.stage != 0 && rank_of(a.stage - 1) != rank_of(a.stage);
    return false;
  }

  // PyTorch's _ready_to_schedule for one leaf action on `rank`.
  bool ready(const Action& a, int rank) const {
    const int mb = a.microbatch.value_or(0);
    if (a.type == ActionType::forward && a.stage != 0) {
      return has(a.stage, mb, forward_received) || (rank_of(a.stage - 1) == rank && has(a.stage - 1, mb, forward_done));
    }
    if (is_backward(a.type) && a.stage != num_stages() - 1) {
      return has(a.stage, mb, backward_received) ||
             (rank_of(a.stage + 1) == rank && has(a.stage + 1, mb, backward_done));
    }
    return true;
  }

  // Why `a` is not ready, for the deadlock message.
  std::string awaited(const Action& a, int rank) const {
    const int mb = *a.microbatch;
    if (a.type == ActionType::forward) {
      const int from = a.stage - 1;
      return "its input: " + to_string(Action::on(from, ActionType::forward, mb)) +
             (rank_of(from) == rank ? " (later on this rank)" : " on rank " + std::to_string(rank_of(from)));
    }
    const int from = a.stage + 1;
    return "its gradient: the backward of stage " + std::to_string(from) + ", microbatch " + std::to_string(mb) +
           (rank_of(from) == rank ? " (later on this rank)" : " on rank " + std::to_string(rank_of(from)));
  }

 private:
  std::size_t index(int stage, int mb) const {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(microbatches_) + static_cast<std::size_t>(mb);
  }

  const std::vector<int>& stage_to_rank_;
  int microbatches_;
  std::vector<std::uint8_t> flags_;
};

const std::vector<Action>& leaves_of(const Action& action, std::vector<Action>& single) {
  if (!action.sub_actions.empty()) return action.sub_actions;
  single.assign(1, action);
  return single;
}

[[noreturn]] void deadlock(const std::vector<RankOrder>& orders, const std::vector<std::size_t>& next,
                           const Progress& progress) {
  std::string message =
      "the schedule cannot be lowered: every rank still running waits on another (PyTorch's _add_send_recv "
      "stops here too):";
  int shown = 0;
  for (std::size_t rank = 0; rank < orders.size(); ++rank) {
    if (next[rank] >= orders[rank].size()) continue;
    if (shown++ == 8) {
      message += " and more;";
      break;
    }
    const Action& action = *orders[rank][next[rank]];
    std::vector<Action> single;
    std::string why;
    for (const Action& leaf : leaves_of(action, single)) {
      if (!progress.ready(leaf, static_cast<int>(rank))) {
        why = (action.sub_actions.empty() ? "" : to_string(leaf) + " ") + "waits for " +
              progress.awaited(leaf, static_cast<int>(rank));
        break;
      }
    }
    message += " rank " + std::to_string(rank) + ", position " + std::to_string(next[rank]) + ", " + to_string(action) +
               " " + why + ";";
  }
  message.back() = '.';
  throw PlanError(message);
}

}  // namespace

std::vector<RankOrder> add_send_recv(const std::vector<RankOrder>& orders, const std::vector<int>& stage_to_rank,
                                     int microbatches) {
  const std::size_t num_ranks = orders.size();
  std::vector<RankOrder> lowered(num_ranks);
  Progress progress(stage_to_rank, microbatches);
  std::vector<std::size_t> next(num_ranks, 0);

  // PyTorch visits every unfinished rank in every step. A rank whose next action is not ready
  // only becomes ready when another rank hands it a RECV, so blocked ranks sleep until then and
  // are visited in the step where PyTorch would first find them ready: later in the same step
  // when woken by a lower rank, in the next step otherwise.
  std::vector<char> asleep(num_ranks, 0);
  std::set<int> this_step;
  std::set<int> next_step;
  for (std::size_t rank = 0; rank < num_ranks; ++rank) {
    if (!orders[rank].empty()) this_step.insert(static_cast<int>(rank));
  }
  auto wake = [&](int rank, int current) {
    if (!asleep[static_cast<std::size_t>(rank)]) return;
    asleep[static_cast<std::size_t>(rank)] = 0;
    (rank > current ? this_step : next_step).insert(rank);
  };

  std::vector<Action> single;
  while (!this_step.empty()) {
    while (!this_step.empty()) {
      const int rank = *this_step.begin();
      this_step.erase(this_step.begin());
      const std::size_t r = static_cast<std::size_t>(rank);
      const std::optional<Action>& step = orders[r][next[r]];
      if (step) {
        const std::vector<Action>& leaves = leaves_of(*step, single);
        bool ready = true;
        for (const Action& leaf : leaves) ready = ready && progress.ready(leaf, rank);
        if (!ready) {
          asleep[r] = 1;
          continue;
        }
        lowered[r].push_back(*step);
        for (const Action& leaf : leaves) {
          const int mb = leaf.microbatch.value_or(0);
          const bool forward = leaf.type == ActionType::forward;
          if (forward) progress.set(leaf.stage, mb, Progress::forward_done);
          if (is_backward(leaf.type)) progress.set(leaf.stage, mb, Progress::backward_done);
          if (!progress.sends(leaf)) continue;
          const int to_stage = forward ? leaf.stage + 1 : leaf.stage - 1;
          const int to_rank = progress.rank_of(to_stage);
          lowered[r].push_back(Action::on(leaf.stage, forward ? ActionType::send_f : ActionType::send_b, mb));
          lowered[static_cast<std::size_t>(to_rank)].push_back(
              Action::on(to_stage, forward ? ActionType::recv_f : ActionType::recv_b, mb));
          progress.set(to_stage, mb, forward ? Progress::forward_received : Progress::backward_received);
          wake(to_rank, rank);
        }
      }
      if (++next[r] < orders[r].size()) next_step.insert(rank);
    }
    this_step.swap(next_step);
  }
  for (std::size_t rank = 0; rank < num_ranks; ++rank) {
    if (next[rank] < orders[rank].size()) deadlock(orders, next, progress);
  }
  return lowered;
}

}  // namespace detail

Schedule lower_schedule(const Schedule& compute_only) {
  detail::check_schedule(compute_only, CsvFormat::compute_only);
  Schedule lowered;
  lowered.ranks = detail::add_send_recv(compute_only.ranks, compute_only.stage_to_rank, compute_only.microbatches);
  lowered.stage_to_rank = compute_only.stage_to_rank;
  lowered.microbatches = compute_only.microbatches;
  return lowered;
}

Schedule lower_schedule_for_runtime(const Schedule& compute_only) {
  detail::check_schedule(compute_only, CsvFormat::compute_only);
  std::vector<RankOrder> prepared;
  prepared.reserve(compute_only.ranks.size());
  for (const RankOrder& order : compute_only.ranks) {
    prepared.push_back(detail::add_reduce_grad(detail::add_unshard_reshard(order, compute_only.num_stages()),
                                               compute_only.num_stages(), compute_only.microbatches));
  }
  Schedule lowered;
  lowered.ranks = detail::add_send_recv(prepared, compute_only.stage_to_rank, compute_only.microbatches);
  lowered.stage_to_rank = compute_only.stage_to_rank;
  lowered.microbatches = compute_only.microbatches;
  return lowered;
}

}  // namespace remat::pipeline
