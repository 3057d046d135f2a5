#pragma once
// Executes a lowered schedule on every rank at once, with each stage's receive buffers drawn
// from a ring, and reports every RECV that is handed a slot whose previous holder is still
// live. Independent of the planner's interval code on purpose: liveness here is "readers
// still to run", counted from the schedule, and ranks advance only as the communication
// allows (a RECV completes after the matching SEND ran), so it tests the plan rather than
// restating it.

#include <remat/pipeline/action.hpp>
#include <remat/pipeline/buffers.hpp>
#include <remat/pipeline/schedule.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace remat::pipeline::testing {

struct RingPolicy {
  // Buffer sets in the ring of (stage, direction); only asked where the stage receives.
  std::function<int(int stage, Direction direction)> ring_size;
  // The slot a RECV of `microbatch` takes, given which slots hold a live buffer right now.
  std::function<int(int stage, Direction direction, int microbatch, const std::vector<bool>& live)> slot;
};

struct Clash {
  int stage = 0;
  Direction direction = Direction::forward;
  std::string text;
};

struct SimulationResult {
  std::vector<Clash> clashes;       // slots handed out while live; corrupted reads
  std::vector<std::string> errors;  // a schedule that cannot run (deadlock, a read before its data)
  int steps = 0;                    // actions executed

  bool clean() const { return clashes.empty() && errors.empty(); }
  bool clashes_on(int stage, Direction direction) const {
    for (const Clash& clash : clashes)
      if (clash.stage == stage && clash.direction == direction) return true;
    return false;
  }
  std::string first_problem() const {
    if (!errors.empty()) return errors.front();
    return clashes.empty() ? std::string("none") : clashes.front().text;
  }
};

class RingSimulator {
 public:
  RingSimulator(const Schedule& lowered, RingPolicy policy) : schedule_(lowered), policy_(std::move(policy)) {
    count_readers();
  }

  SimulationResult run() {
    std::vector<std::size_t> next(schedule_.ranks.size(), 0);
    bool all_done = false;
    while (!all_done && result_.errors.empty()) {
      bool progressed = false;
      all_done = true;
      for (std::size_t rank = 0; rank < schedule_.ranks.size(); ++rank) {
        const RankOrder& order = schedule_.ranks[rank];
        while (next[rank] < order.size() && result_.errors.empty()) {
          const std::optional<Action>& action = order[next[rank]];
          if (action && !ready(*action)) break;
          if (action) execute(static_cast<int>(rank), static_cast<int>(next[rank]), *action);
          ++next[rank];
          progressed = true;
        }
        if (next[rank] < order.size()) all_done = false;
      }
      if (!all_done && !progressed) {
        std::string stuck;
        for (std::size_t rank = 0; rank < schedule_.ranks.size(); ++rank) {
          if (next[rank] < schedule_.ranks[rank].size()) {
            stuck += " rank " + std::to_string(rank) + " at " + to_string(*schedule_.ranks[rank][next[rank]]);
          }
        }
        result_.errors.push_back("deadlock:" + stuck);
      }
    }
    return result_;
  }

 private:
  using Key = std::tuple<int, Direction, int>;  // (stage, direction, microbatch)
  struct Holder {
    int microbatch = -1;
    int readers_left = 0;
  };

  static std::vector<const Action*> parts(const Action& action) {
    std::vector<const Action*> out;
    if (action.type == ActionType::overlap_f_b) {
      for (const Action& part : action.sub_actions) out.push_back(&part);
    } else {
      out.push_back(&action);
    }
    return out;
  }

  // The buffers an action reads: its stage input (F, B, I, W, and SEND_F, which can send the
  // input itself) and the gradient it received (B, I, W, and SEND_B, which can send it back).
  static std::vector<Key> reads(const Action& a) {
    const int mb = a.microbatch.value_or(-1);
    switch (a.type) {
      case ActionType::forward:
      case ActionType::send_f: return {Key{a.stage, Direction::forward, mb}};
      case ActionType::send_b: return {Key{a.stage, Direction::backward, mb}};
      case ActionType::full_backward:
      case ActionType::backward_input:
      case ActionType::backward_weight:
        return {Key{a.stage, Direction::forward, mb}, Key{a.stage, Direction::backward, mb}};
      default: return {};
    }
  }

  void count_readers() {
    for (const RankOrder& order : schedule_.ranks) {
      for (const std::optional<Action>& action : order) {
        if (!action) continue;
        for (const Action* part : parts(*action)) {
          for (const Key& key : reads(*part)) ++readers_[key];
        }
      }
    }
  }

  bool ready(const Action& action) const {
    for (const Action* a : parts(action)) {
      const int mb = a->microbatch.value_or(-1);
      if (a->type == ActionType::recv_f && !sent_.count({a->stage - 1, ActionType::send_f, mb})) return false;
      if (a->type == ActionType::recv_b && !sent_.count({a->stage + 1, ActionType::send_b, mb})) return false;
    }
    return true;
  }

  bool same_rank(int a, int b) const {
    if (a < 0 || b < 0 || a >= schedule_.num_stages() || b >= schedule_.num_stages()) return false;
    return schedule_.stage_to_rank[static_cast<std::size_t>(a)] == schedule_.stage_to_rank[static_cast<std::size_t>(b)];
  }

  void error(int rank, int position, const Action& a, const std::string& what) {
    result_.errors.push_back("rank " + std::to_string(rank) + " position " + std::to_string(position) + " " +
                             to_string(a) + ": " + what);
  }

  // The input of a compute must exist: received, or made by the neighbour on this rank.
  void check_input(int rank, int position, const Action& a) {
    const int mb = *a.microbatch;
    if (a.type == ActionType::forward && a.stage > 0) {
      const bool local = same_rank(a.stage - 1, a.stage) && done_.count({a.stage - 1, ActionType::forward, mb});
      if (!local && !slot_of_.count({a.stage, Direction::forward, mb}))
        error(rank, position, a, "runs before its input");
    }
    const bool backward = a.type == ActionType::full_backward || a.type == ActionType::backward_input;
    if (backward && a.stage + 1 < schedule_.num_stages()) {
      const bool local =
          same_rank(a.stage + 1, a.stage) && (done_.count({a.stage + 1, ActionType::full_backward, mb}) ||
                                              done_.count({a.stage + 1, ActionType::backward_input, mb}));
      if (!local && !slot_of_.count({a.stage, Direction::backward, mb})) {
        error(rank, position, a, "runs before its gradient");
      }
    }
  }

  void receive(int rank, int position, const Action& a, Direction direction) {
    const Key key{a.stage, direction, *a.microbatch};
    std::vector<Holder>& ring = rings_[{a.stage, direction}];
    if (ring.empty()) ring.resize(static_cast<std::size_t>(std::max(0, policy_.ring_size(a.stage, direction))));
    std::vector<bool> live(ring.size());
    for (std::size_t i = 0; i < ring.size(); ++i) live[i] = ring[i].readers_left > 0;
    const int slot = policy_.slot(a.stage, direction, *a.microbatch, live);
    if (slot < 0 || slot >= static_cast<int>(ring.size())) {
      error(rank, position, a,
            "slot " + std::to_string(slot) + " is outside the ring of " + std::to_string(ring.size()));
      return;
    }
    Holder& holder = ring[static_cast<std::size_t>(slot)];
    if (holder.readers_left > 0) {
      result_.clashes.push_back({a.stage, direction,
                                 "rank " + std::to_string(rank) + " position " + std::to_string(position) + " " +
                                     to_string(a) + " takes slot " + std::to_string(slot) + " while microbatch " +
                                     std::to_string(holder.microbatch) + " still has " +
                                     std::to_string(holder.readers_left) + " reader(s) to run"});
    }
    holder = Holder{*a.microbatch, readers_[key]};
    slot_of_[key] = slot;
  }

  // A reader finds its own microbatch in its slot, or the buffer was overwritten.
  void read(int rank, int position, const Action& a) {
    for (const Key& key : reads(a)) {
      const auto found = slot_of_.find(key);
      if (found == slot_of_.end()) continue;  // made on this rank, or the stage's own input
      Holder& holder = rings_[{std::get<0>(key), std::get<1>(key)}][static_cast<std::size_t>(found->second)];
      if (holder.microbatch != std::get<2>(key)) {
        result_.clashes.push_back({std::get<0>(key), std::get<1>(key),
                                   "rank " + std::to_string(rank) + " position " + std::to_string(position) + " " +
                                       to_string(a) + " reads slot " + std::to_string(found->second) +
                                       ", which now holds microbatch " + std::to_string(holder.microbatch)});
        continue;
      }
      --holder.readers_left;
    }
  }

  void execute(int rank, int position, const Action& action) {
    ++result_.steps;
    for (const Action* a : parts(action)) {
      const int mb = a->microbatch.value_or(-1);
      switch (a->type) {
        case ActionType::recv_f: receive(rank, position, *a, Direction::forward); break;
        case ActionType::recv_b: receive(rank, position, *a, Direction::backward); break;
        case ActionType::send_f:
        case ActionType::send_b: {
          const bool made = a->type == ActionType::send_f
                                ? done_.count({a->stage, ActionType::forward, mb}) > 0
                                : done_.count({a->stage, ActionType::full_backward, mb}) +
                                          done_.count({a->stage, ActionType::backward_input, mb}) >
                                      0;
          if (!made) error(rank, position, *a, "sends what this rank has not computed yet");
          read(rank, position, *a);
          sent_.insert({a->stage, a->type, mb});
          break;
        }
        case ActionType::forward:
        case ActionType::full_backward:
        case ActionType::backward_input:
        case ActionType::backward_weight:
          check_input(rank, position, *a);
          read(rank, position, *a);
          done_.insert({a->stage, a->type, mb});
          break;
        default: break;
      }
    }
  }

  const Schedule& schedule_;
  RingPolicy policy_;
  SimulationResult result_;
  std::map<Key, int> readers_;
  std::map<Key, int> slot_of_;
  std::map<std::pair<int, Direction>, std::vector<Holder>> rings_;
  std::set<std::tuple<int, ActionType, int>> sent_;
  std::set<std::tuple<int, ActionType, int>> done_;
};

inline SimulationResult simulate(const Schedule& lowered, RingPolicy policy) {
  return RingSimulator(lowered, std::move(policy)).run();
}

}  // namespace remat::pipeline::testing
