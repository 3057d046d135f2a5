// The checks a lowered (compute_comms) schedule gets beyond those of its compute actions:
// every SEND and RECV where PyTorch's runtime needs it, receives posted in the order the peer
// sends, and a run of all ranks that reaches the end.

#include <remat/pipeline/errors.hpp>

#include "detail/validation.hpp"

#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

namespace remat::pipeline::detail {
namespace {

using Kind = ScheduleIndex::Kind;

Kind kind_of(ActionType type) { return *ScheduleIndex::kind_of(type); }

// A message between two ranks, named by the stage that receives it.
struct Message {
  bool forward;
  int to_stage;
  int mb;
  int rank;  // where this end of it sits
  std::size_t position;
  bool operator==(const Message& o) const { return forward == o.forward && to_stage == o.to_stage && mb == o.mb; }
};

class CommunicationCheck {
 public:
  CommunicationCheck(const Schedule& s, const ScheduleIndex& index) : s_(s), index_(index) {}

  void run() {
    for_each_leaf(s_, [&](int rank, std::size_t position, const Action& leaf, const Action& step) {
      rank_ = rank;
      position_ = position;
      leaf_ = &leaf;
      step_ = &step;
      check(leaf);
    });
    check_pair_order();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw PlanError(where(rank_, position_, *leaf_, *step_) + ": " + what);
  }
  int rank_of(int stage) const { return s_.stage_to_rank[static_cast<std::size_t>(stage)]; }
  bool on_other_rank(int stage) const { return rank_of(stage) != rank_; }
  std::int32_t self() const { return index_.ordinal(kind_of(leaf_->type), leaf_->stage, *leaf_->microbatch); }

  // `type` of (stage, mb) must exist on this rank, before this action (or after it).
  void needs(ActionType type, int stage, int mb, bool before, const std::string& why) const {
    const std::int32_t other = index_.ordinal(kind_of(type), stage, mb);
    if (other < 0) {
      fail(why + ", but rank " + std::to_string(rank_of(stage)) + " has no " + action_name(stage, type, mb));
    }
    if ((other < self()) != before) {
      fail(why + ", but " + action_name(stage, type, mb) + " is at position " +
           std::to_string(index_.position(kind_of(type), stage, mb)));
    }
  }
  void needs_backward_before(int stage, int mb, const std::string& why) const {
    const ActionType type = index_.has(Kind::input, stage, mb) ? ActionType::backward_input : ActionType::full_backward;
    needs(type, stage, mb, true, why);
  }
  void needs_peer(ActionType type, int stage, int mb, const std::string& why) const {
    if (index_.has(kind_of(type), stage, mb)) return;
    fail(why + ", but rank " + std::to_string(rank_of(stage)) + " has no " + action_name(stage, type, mb));
  }
  void no_neighbour(bool missing, const char* what) const {
    if (missing) fail(what);
  }
  void not_same_rank(int neighbour) const {
    if (on_other_rank(neighbour)) return;
    fail("stages " + std::to_string(std::min(neighbour, leaf_->stage)) + " and " +
         std::to_string(std::max(neighbour, leaf_->stage)) + " both run on rank " + std::to_string(rank_) +
         ", which hands the tensor over in place: there is no SEND or RECV between them (PyTorch's lowering "
         "adds none)");
  }

  void check(const Action& leaf) {
    const int stage = leaf.stage;
    const int last = s_.num_stages() - 1;
    if (!leaf.microbatch) return;  // UNSHARD, RESHARD, REDUCE_GRAD
    const int mb = *leaf.microbatch;
    switch (leaf.type) {
      case ActionType::forward:
        if (stage > 0 && on_other_rank(stage - 1)) {
          needs(ActionType::recv_f, stage, mb, true, "a forward runs after the receive of its input");
        } else if (stage > 0) {
          needs(ActionType::forward, stage - 1, mb, true, "a forward runs after the forward that computes its input");
        }
        if (stage < last && on_other_rank(stage + 1)) {
          needs(ActionType::send_f, stage, mb, false, "a forward's output goes to the next stage's rank");
        }
        break;
      case ActionType::full_backward:
      case ActionType::backward_input:
        if (stage < last && on_other_rank(stage + 1)) {
          needs(ActionType::recv_b, stage, mb, true, "a backward runs after the receive of its gradient");
        } else if (stage < last && !index_.has(Kind::input, stage + 1, mb)) {
          needs(ActionType::full_backward, stage + 1, mb, true, "a backward runs after the backward of the next stage");
        } else if (stage < last) {
          needs(ActionType::backward_input, stage + 1, mb, true,
                "a backward runs after the backward of the next stage");
        }
        if (stage > 0 && on_other_rank(stage - 1)) {
          needs(ActionType::send_b, stage, mb, false, "a backward's input gradient goes to the previous stage's rank");
        }
        break;
      case ActionType::send_f:
        no_neighbour(stage == last, "the last stage has no next stage to send activations to");
        not_same_rank(stage + 1);
        needs(ActionType::forward, stage, mb, true, "a SEND_F runs after the forward that computes it");
        needs_peer(ActionType::recv_f, stage + 1, mb, "it must be received");
        break;
      case ActionType::recv_f:
        no_neighbour(stage == 0, "stage 0 has no previous stage to receive activations from");
        not_same_rank(stage - 1);
        needs_peer(ActionType::send_f, stage - 1, mb, "something must send it");
        break;
      case ActionType::send_b:
        no_neighbour(stage == 0, "stage 0 has no previous stage to send gradients to");
        not_same_rank(stage - 1);
        needs_backward_before(stage, mb, "a SEND_B runs after the backward that computes it");
        needs_peer(ActionType::recv_b, stage - 1, mb, "it must be received");
        break;
      case ActionType::recv_b:
        no_neighbour(stage == last, "the last stage has no next stage to receive gradients from");
        not_same_rank(stage + 1);
        needs_peer(ActionType::send_b, stage + 1, mb, "something must send it");
        break;
      default: break;
    }
    if (leaf.type == ActionType::send_f || leaf.type == ActionType::send_b) {
      const bool forward = leaf.type == ActionType::send_f;
      const int to_stage = forward ? stage + 1 : stage - 1;
      sends_[{rank_, rank_of(to_stage)}].push_back({forward, to_stage, mb, rank_, position_});
    }
    if (leaf.type == ActionType::recv_f || leaf.type == ActionType::recv_b) {
      const bool forward = leaf.type == ActionType::recv_f;
      const int from_stage = forward ? stage - 1 : stage + 1;
      receives_[{rank_of(from_stage), rank_}].push_back({forward, stage, mb, rank_, position_});
    }
  }

  // Point-to-point messages between two ranks are matched in the order they are posted: a
  // receive posted out of order would get another microbatch's tensor.
  void check_pair_order() const {
    for (const auto& [pair, receives] : receives_) {
      const std::vector<Message>& sends = sends_.at(pair);
      for (std::size_t k = 0; k < receives.size() && k < sends.size(); ++k) {
        if (receives[k] == sends[k]) continue;
        const Message& r = receives[k];
        const Message& s = sends[k];
        const ActionType recv_type = r.forward ? ActionType::recv_f : ActionType::recv_b;
        const ActionType send_type = s.forward ? ActionType::send_f : ActionType::send_b;
        const int send_stage = s.forward ? s.to_stage - 1 : s.to_stage + 1;
        throw PlanError("rank " + std::to_string(r.rank) + ", position " + std::to_string(r.position) + ", " +
                        action_name(r.to_stage, recv_type, r.mb) + ": it is receive number " + std::to_string(k + 1) +
                        " from rank " + std::to_string(pair.first) + ", whose send number " + std::to_string(k + 1) +
                        " to rank " + std::to_string(pair.second) + " is " + action_name(send_stage, send_type, s.mb) +
                        " (position " + std::to_string(s.position) +
                        "): messages between two ranks are matched in the order they are posted, so it would "
                        "receive the wrong tensor; post the receives in the order the peer sends");
      }
    }
  }

  const Schedule& s_;
  const ScheduleIndex& index_;
  int rank_ = 0;
  std::size_t position_ = 0;
  const Action* leaf_ = nullptr;
  const Action* step_ = nullptr;
  std::map<std::pair<int, int>, std::vector<Message>> sends_;     // (from rank, to rank)
  std::map<std::pair<int, int>, std::vector<Message>> receives_;  // (from rank, to rank)
};

// The send a compute waits for, as (forward?, sending stage, microbatch); none when its data is
// on this rank already.
struct Awaited {
  bool forward = false;
  int stage = -1;
  int mb = 0;
};

}  // namespace

void check_communication(const Schedule& schedule, const ScheduleIndex& index) {
  CommunicationCheck(schedule, index).run();
}

void check_runs_without_deadlock(const Schedule& s) {
  const std::size_t num_ranks = s.ranks.size();
  const int last = s.num_stages() - 1;
  const auto rank_of = [&](int stage) { return s.stage_to_rank[static_cast<std::size_t>(stage)]; };
  const auto key = [&](bool forward, int stage, int mb) {
    return (static_cast<std::int64_t>(stage) * s.microbatches + mb) * 2 + (forward ? 1 : 0);
  };
  std::unordered_map<std::int64_t, char> sent;
  std::unordered_map<std::int64_t, int> waiting;  // send -> rank waiting for it
  std::vector<std::size_t> next(num_ranks, 0);
  std::vector<Awaited> blocked_on(num_ranks);
  std::deque<int> runnable;
  for (std::size_t rank = 0; rank < num_ranks; ++rank) runnable.push_back(static_cast<int>(rank));

  auto awaited = [&](const Action& leaf, int rank) -> Awaited {
    const int stage = leaf.stage;
    if (leaf.type == ActionType::forward && stage > 0 && rank_of(stage - 1) != rank) {
      return {true, stage - 1, *leaf.microbatch};
    }
    if (is_backward(leaf.type) && stage < last && rank_of(stage + 1) != rank)
      return {false, stage + 1, *leaf.microbatch};
    return {};
  };

  while (!runnable.empty()) {
    const int rank = runnable.front();
    runnable.pop_front();
    const std::size_t r = static_cast<std::size_t>(rank);
    while (next[r] < s.ranks[r].size()) {
      const Action& step = *s.ranks[r][next[r]];
      const Action* leaves = step.sub_actions.empty() ? &step : step.sub_actions.data();
      const std::size_t count = step.sub_actions.empty() ? 1 : step.sub_actions.size();
      Awaited wait;
      for (std::size_t i = 0; i < count && wait.stage < 0; ++i) {
        const Awaited a = awaited(leaves[i], rank);
        if (a.stage >= 0 && !sent.count(key(a.forward, a.stage, a.mb))) wait = a;
      }
      if (wait.stage >= 0) {
        blocked_on[r] = wait;
        waiting[key(wait.forward, wait.stage, wait.mb)] = rank;
        break;
      }
      for (std::size_t i = 0; i < count; ++i) {
        const Action& leaf = leaves[i];
        if (leaf.type != ActionType::send_f && leaf.type != ActionType::send_b) continue;
        const std::int64_t k = key(leaf.type == ActionType::send_f, leaf.stage, *leaf.microbatch);
        sent[k] = 1;
        const auto w = waiting.find(k);
        if (w == waiting.end()) continue;
        runnable.push_back(w->second);
        waiting.erase(w);
      }
      ++next[r];
    }
  }

  std::string message = "the schedule deadlocks: every rank still running waits for a send that never comes:";
  bool stuck = false;
  for (std::size_t rank = 0; rank < num_ranks; ++rank) {
    if (next[rank] >= s.ranks[rank].size()) continue;
    stuck = true;
    const Awaited& a = blocked_on[rank];
    const ActionType send = a.forward ? ActionType::send_f : ActionType::send_b;
    const int peer = rank_of(a.stage);
    message += " rank " + std::to_string(rank) + ", position " + std::to_string(next[rank]) + ", " +
               to_string(*s.ranks[rank][next[rank]]) + " waits for " + action_name(a.stage, send, a.mb) + " on rank " +
               std::to_string(peer) + ";";
  }
  if (!stuck) return;
  message.back() = '.';
  throw PlanError(message);
}

}  // namespace remat::pipeline::detail
