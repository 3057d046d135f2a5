#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/validate.hpp>

#include "detail/lowering.hpp"
#include "detail/validation.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace remat::pipeline {
namespace detail {
namespace {

using Kind = ScheduleIndex::Kind;

[[noreturn]] void fail(int rank, std::size_t position, const Action& leaf, const Action& step,
                       const std::string& what) {
  throw PlanError(where(rank, position, leaf, step) + ": " + what);
}

std::string range(int count) { return "0.." + std::to_string(count - 1); }

bool is_stage_wide(ActionType t) {
  return t == ActionType::unshard || t == ActionType::reshard || t == ActionType::reduce_grad;
}
bool is_leaf_compute(ActionType t) {
  return t == ActionType::forward || t == ActionType::full_backward || t == ActionType::backward_input ||
         t == ActionType::backward_weight;
}

void check_shape(const Schedule& s) {
  if (s.ranks.empty()) throw PlanError("the schedule has no ranks (a CSV needs one row per rank)");
  if (s.stage_to_rank.empty()) throw PlanError("the schedule has no stages");
  if (s.microbatches < 1) {
    throw PlanError("the schedule has no microbatches (microbatches = " + std::to_string(s.microbatches) + ")");
  }
  std::vector<char> holds_stage(s.ranks.size(), 0);
  for (int stage = 0; stage < s.num_stages(); ++stage) {
    const int rank = s.stage_to_rank[static_cast<std::size_t>(stage)];
    if (rank < 0 || rank >= s.num_ranks()) {
      throw PlanError("stage " + std::to_string(stage) + " is mapped to rank " + std::to_string(rank) +
                      ", but the schedule has ranks " + range(s.num_ranks()));
    }
    holds_stage[static_cast<std::size_t>(rank)] = 1;
  }
  for (std::size_t rank = 0; rank < s.ranks.size(); ++rank) {
    if (!holds_stage[rank]) {
      throw PlanError("rank " + std::to_string(rank) +
                      " runs no stage: every rank runs at least one (in a CSV every line is a rank, a blank one too)");
    }
  }
}

// Each action on its own: a kind the format allows, a stage of this rank, a microbatch that
// exists (and none for UNSHARD, RESHARD and REDUCE_GRAD).
void check_each_action(const Schedule& s, CsvFormat format) {
  const bool comms = format == CsvFormat::compute_comms;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    const int rank = static_cast<int>(r);
    const RankOrder& order = s.ranks[r];
    for (std::size_t position = 0; position < order.size(); ++position) {
      if (!order[position]) {
        if (!comms) continue;
        throw PlanError("rank " + std::to_string(rank) + ", position " + std::to_string(position) +
                        ": an empty cell (idle step) has no place in a compute_comms schedule, where every cell "
                        "holds an action (PyTorch's _load_csv refuses it too)");
      }
      const Action& step = *order[position];
      if (step.type == ActionType::overlap_f_b) {
        if (step.sub_actions.empty()) fail(rank, position, step, step, "an OVERLAP_F_B group needs sub-actions");
        for (const Action& sub : step.sub_actions) {
          if (!is_leaf_compute(sub.type)) {
            fail(rank, position, sub, step, "an OVERLAP_F_B group holds only F, B, I and W actions");
          }
        }
      } else if (!step.sub_actions.empty()) {
        fail(rank, position, step, step, "only OVERLAP_F_B groups hold sub-actions");
      }
    }
  }
  for_each_leaf(s, [&](int rank, std::size_t position, const Action& leaf, const Action& step) {
    if (!comms && !is_leaf_compute(leaf.type)) {
      fail(rank, position, leaf, step,
           "a compute_only schedule holds F, B, I, W and OVERLAP_F_B only (load a lowered schedule as compute_comms)");
    }
    if (leaf.stage < 0 || leaf.stage >= s.num_stages()) {
      fail(rank, position, leaf, step,
           "stage " + std::to_string(leaf.stage) + " does not exist: the schedule has stages " + range(s.num_stages()));
    }
    const int owner = s.stage_to_rank[static_cast<std::size_t>(leaf.stage)];
    if (owner != rank) {
      fail(rank, position, leaf, step,
           "stage " + std::to_string(leaf.stage) + " runs on rank " + std::to_string(owner) + ", not on rank " +
               std::to_string(rank) + ": a stage runs on one rank");
    }
    if (is_stage_wide(leaf.type)) {
      if (leaf.microbatch) fail(rank, position, leaf, step, std::string(to_string(leaf.type)) + " takes no microbatch");
      return;
    }
    if (!leaf.microbatch) {
      fail(rank, position, leaf, step,
           "no microbatch index: write it as " + std::to_string(leaf.stage) + std::string(to_string(leaf.type)) + "0");
    }
    if (*leaf.microbatch < 0 || *leaf.microbatch >= s.microbatches) {
      fail(rank, position, leaf, step,
           "microbatch " + std::to_string(*leaf.microbatch) + " does not exist: the schedule has microbatches " +
               range(s.microbatches));
    }
  });
}

// A stage short of forwards is named before anything sized stages x microbatches is built, so
// that a schedule claiming a huge stage or microbatch count fails fast.
void check_forward_count(const Schedule& s) {
  std::vector<std::int64_t> forwards(s.stage_to_rank.size(), 0);
  std::int64_t total = 0;
  for_each_leaf(s, [&](int, std::size_t, const Action& leaf, const Action&) {
    if (leaf.type != ActionType::forward) return;
    ++forwards[static_cast<std::size_t>(leaf.stage)];
    ++total;
  });
  if (std::int64_t{s.num_stages()} * s.microbatches <= total) return;
  for (int stage = 0; stage < s.num_stages(); ++stage) {
    if (forwards[static_cast<std::size_t>(stage)] >= s.microbatches) continue;
    std::vector<int> seen;
    for_each_leaf(s, [&](int, std::size_t, const Action& leaf, const Action&) {
      if (leaf.type == ActionType::forward && leaf.stage == stage) seen.push_back(*leaf.microbatch);
    });
    std::sort(seen.begin(), seen.end());
    int missing = 0;
    for (const int mb : seen) {
      if (mb > missing) break;
      if (mb == missing) ++missing;
    }
    const int rank = s.stage_to_rank[static_cast<std::size_t>(stage)];
    throw PlanError("rank " + std::to_string(rank) + ": stage " + std::to_string(stage) + " never runs " +
                    std::to_string(stage) + "F" + std::to_string(missing) +
                    ": every stage runs F once for each of the " + std::to_string(s.microbatches) + " microbatches " +
                    range(s.microbatches));
  }
}

// In reading order: F before B or I, I before W, and a backward is B or I+W, never both.
void check_order(const Schedule& s, const ScheduleIndex& index) {
  for_each_leaf(s, [&](int rank, std::size_t position, const Action& leaf, const Action& step) {
    const int stage = leaf.stage;
    const int mb = leaf.microbatch.value_or(0);
    const auto kind = ScheduleIndex::kind_of(leaf.type);
    const std::int32_t self = kind ? index.ordinal(*kind, stage, mb) : -1;
    auto needs_before = [&](Kind earlier, ActionType type, const std::string& why) {
      const std::int32_t other = index.ordinal(earlier, stage, mb);
      if (other < 0) {
        fail(rank, position, leaf, step, why + ", but the schedule has no " + action_name(stage, type, mb));
      }
      if (other > self) {
        fail(rank, position, leaf, step,
             why + ", but " + action_name(stage, type, mb) + " comes later, at position " +
                 std::to_string(index.position(earlier, stage, mb)));
      }
    };
    auto not_both = [&](Kind other, ActionType type) {
      if (!index.has(other, stage, mb)) return;
      fail(rank, position, leaf, step,
           "stage " + std::to_string(stage) + " also runs " + action_name(stage, type, mb) + " (position " +
               std::to_string(index.position(other, stage, mb)) +
               "): a microbatch's backward is either B, or I and later W");
    };
    switch (leaf.type) {
      case ActionType::full_backward:
        needs_before(Kind::forward, ActionType::forward, "a backward runs after its forward");
        not_both(Kind::input, ActionType::backward_input);
        break;
      case ActionType::backward_input:
        needs_before(Kind::forward, ActionType::forward, "a backward runs after its forward");
        not_both(Kind::backward, ActionType::full_backward);
        if (!index.has(Kind::weight, stage, mb)) {
          fail(rank, position, leaf, step,
               "no " + action_name(stage, ActionType::backward_weight, mb) +
                   " follows it: an I leaves the weight gradient to a later W");
        }
        break;
      case ActionType::backward_weight:
        needs_before(Kind::input, ActionType::backward_input, "a W runs after the I of its stage and microbatch");
        break;
      default: break;
    }
  });
}

void check_complete(const Schedule& s, const ScheduleIndex& index) {
  for (int stage = 0; stage < s.num_stages(); ++stage) {
    for (int mb = 0; mb < s.microbatches; ++mb) {
      if (index.has(Kind::backward, stage, mb) || index.has(Kind::input, stage, mb)) continue;
      throw PlanError("rank " + std::to_string(s.stage_to_rank[static_cast<std::size_t>(stage)]) + ": stage " +
                      std::to_string(stage) + " never runs a backward for microbatch " + std::to_string(mb) +
                      ": it needs " + action_name(stage, ActionType::full_backward, mb) + ", or " +
                      action_name(stage, ActionType::backward_input, mb) + " and " +
                      action_name(stage, ActionType::backward_weight, mb));
    }
  }
}

}  // namespace

std::string where(int rank, std::size_t position, const Action& leaf, const Action& step) {
  std::string out = "rank " + std::to_string(rank) + ", position " + std::to_string(position) + ", " + to_string(leaf);
  if (&leaf != &step) out += " (in " + to_string(step) + ")";
  return out;
}

void for_each_leaf(const Schedule& schedule,
                   const std::function<void(int, std::size_t, const Action&, const Action&)>& visit) {
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    const RankOrder& order = schedule.ranks[rank];
    for (std::size_t position = 0; position < order.size(); ++position) {
      if (!order[position]) continue;
      const Action& step = *order[position];
      if (step.sub_actions.empty()) {
        visit(static_cast<int>(rank), position, step, step);
        continue;
      }
      for (const Action& sub : step.sub_actions) visit(static_cast<int>(rank), position, sub, step);
    }
  }
}

std::optional<ScheduleIndex::Kind> ScheduleIndex::kind_of(ActionType type) {
  switch (type) {
    case ActionType::forward: return forward;
    case ActionType::full_backward: return backward;
    case ActionType::backward_input: return input;
    case ActionType::backward_weight: return weight;
    case ActionType::send_f: return send_f;
    case ActionType::recv_f: return recv_f;
    case ActionType::send_b: return send_b;
    case ActionType::recv_b: return recv_b;
    default: return std::nullopt;
  }
}

ScheduleIndex::ScheduleIndex(const Schedule& schedule, bool with_comms)
    : microbatches_(schedule.microbatches),
      per_kind_(schedule.stage_to_rank.size() * static_cast<std::size_t>(schedule.microbatches)) {
  ordinals_.assign(per_kind_ * (with_comms ? kinds : send_f), -1);
  for_each_leaf(schedule, [&](int rank, std::size_t position, const Action& leaf, const Action& step) {
    const auto kind = kind_of(leaf.type);
    if (!kind || (!with_comms && *kind >= send_f)) return;
    if (positions_.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      throw PlanError("the schedule has more actions than the planner can index");
    }
    std::int32_t& ordinal = ordinals_[slot(*kind, leaf.stage, *leaf.microbatch)];
    if (ordinal >= 0) {
      fail(rank, position, leaf, step,
           "runs a second time (first at position " + std::to_string(positions_[static_cast<std::size_t>(ordinal)]) +
               "): each stage runs each microbatch once per kind");
    }
    ordinal = static_cast<std::int32_t>(positions_.size());
    positions_.push_back(static_cast<std::int32_t>(position));
  });
}

void check_schedule(const Schedule& schedule, CsvFormat format) {
  check_shape(schedule);
  check_each_action(schedule, format);
  check_forward_count(schedule);
  const ScheduleIndex index(schedule, format == CsvFormat::compute_comms);
  check_order(schedule, index);
  check_complete(schedule, index);
  if (format == CsvFormat::compute_comms) check_communication(schedule, index);
}

}  // namespace detail

void validate_schedule(const Schedule& schedule, CsvFormat format) {
  detail::check_schedule(schedule, format);
  if (format == CsvFormat::compute_only) {
    detail::add_send_recv(schedule.ranks, schedule.stage_to_rank, schedule.microbatches);
  } else {
    detail::check_runs_without_deadlock(schedule);
  }
}

}  // namespace remat::pipeline
