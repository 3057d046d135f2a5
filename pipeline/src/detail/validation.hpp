#pragma once
// The pieces of validate_schedule: an index of where every action sits (by kind, stage and
// microbatch), and the checks a lowered (compute_comms) schedule gets on top of those of its
// compute actions.

#include <remat/pipeline/schedule.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace remat::pipeline::detail {

// "1B2": the action on one stage and microbatch, as the error messages name it.
inline std::string action_name(int stage, ActionType type, int mb) { return to_string(Action::on(stage, type, mb)); }

// "rank 1, position 4, 1B2", with the group it belongs to for a sub-action.
std::string where(int rank, std::size_t position, const Action& leaf, const Action& step);

// Calls `visit(rank, position, leaf, step)` for every action in reading order (rank by rank),
// a group's sub-actions one by one.
void for_each_leaf(const Schedule& schedule,
                   const std::function<void(int, std::size_t, const Action&, const Action&)>& visit);

// Built after each action has been checked on its own (stage and microbatch in range, on the
// stage's rank).
class ScheduleIndex {
 public:
  enum Kind { forward, backward, input, weight, send_f, recv_f, send_b, recv_b, kinds };
  static std::optional<Kind> kind_of(ActionType type);

  // Throws PlanError at the second occurrence of any action.
  ScheduleIndex(const Schedule& schedule, bool with_comms);

  bool has(Kind kind, int stage, int mb) const { return ordinal(kind, stage, mb) >= 0; }
  // The action's place in reading order (a group's sub-actions one after the other), or -1
  // when the schedule lacks it; within one rank, earlier means it runs first.
  std::int32_t ordinal(Kind kind, int stage, int mb) const { return ordinals_[slot(kind, stage, mb)]; }
  // The cell (position in its rank's order) it sits in; the action must exist.
  std::size_t position(Kind kind, int stage, int mb) const {
    return static_cast<std::size_t>(positions_[static_cast<std::size_t>(ordinal(kind, stage, mb))]);
  }

 private:
  std::size_t slot(Kind kind, int stage, int mb) const {
    return static_cast<std::size_t>(kind) * per_kind_ +
           static_cast<std::size_t>(stage) * static_cast<std::size_t>(microbatches_) + static_cast<std::size_t>(mb);
  }

  int microbatches_ = 0;
  std::size_t per_kind_ = 0;
  std::vector<std::int32_t> ordinals_;   // kinds x stages x microbatches
  std::vector<std::int32_t> positions_;  // by ordinal
};

// Every SEND and RECV pairs with its compute and its peer, none between stages on one rank,
// and receives from a peer are posted in the order the peer sends.
void check_communication(const Schedule& schedule, const ScheduleIndex& index);

// Runs the ranks as PyTorch's runtime does (sends and receives are posted without waiting, a
// compute waits for the data it receives) and throws PlanError naming every stuck rank if
// they stop before the end.
void check_runs_without_deadlock(const Schedule& schedule);

}  // namespace remat::pipeline::detail
