#include <remat/pipeline/buffers.hpp>
#include <remat/pipeline/errors.hpp>

#include <algorithm>
#include <functional>
#include <queue>
#include <string>
#include <utility>

namespace remat::pipeline {
namespace {

constexpr int kNone = -1;

std::string where(int rank, int position, const Action& action) {
  return "rank " + std::to_string(rank) + ", position " + std::to_string(position) + ", action " + to_string(action);
}

// What one rank's order says about one (stage, direction, microbatch) buffer.
struct Uses {
  int recv = kNone;        // position of the RECV
  int first_read = kNone;  // the compute that must come after the RECV (F, or B/I)
  int last_read = kNone;
  Action recv_action;
};

class Scanner {
 public:
  explicit Scanner(const Schedule& schedule)
      : schedule_(schedule),
        microbatches_(schedule.microbatches),
        uses_(static_cast<std::size_t>(2 * schedule.num_stages()) *
              static_cast<std::size_t>(std::max(0, microbatches_))) {}

  void scan() {
    for (int rank = 0; rank < schedule_.num_ranks(); ++rank) {
      const RankOrder& order = schedule_.ranks[static_cast<std::size_t>(rank)];
      for (int position = 0; position < static_cast<int>(order.size()); ++position) {
        const std::optional<Action>& action = order[static_cast<std::size_t>(position)];
        if (!action) continue;
        if (action->type == ActionType::overlap_f_b) {
          for (const Action& part : action->sub_actions) visit(rank, position, part, *action);
        } else {
          visit(rank, position, *action, *action);
        }
      }
    }
  }

  BufferAnalysis result() const {
    BufferAnalysis analysis;
    analysis.microbatches = microbatches_;
    for (int stage = 0; stage < schedule_.num_stages(); ++stage) {
      for (const Direction direction : {Direction::forward, Direction::backward}) {
        analysis.stages.push_back(stage_buffers(stage, direction));
      }
    }
    return analysis;
  }

 private:
  std::size_t index(int stage, Direction direction, int microbatch) const {
    return (static_cast<std::size_t>(stage) * 2 + (direction == Direction::backward ? 1 : 0)) *
               static_cast<std::size_t>(microbatches_) +
           static_cast<std::size_t>(microbatch);
  }
  Uses& uses(int stage, Direction direction, int microbatch) { return uses_[index(stage, direction, microbatch)]; }
  const Uses& uses(int stage, Direction direction, int microbatch) const {
    return uses_[index(stage, direction, microbatch)];
  }

  void check_placement(int rank, int position, const Action& action, const Action& shown) const {
    if (action.stage < 0 || action.stage >= schedule_.num_stages()) {
      throw PlanError(where(rank, position, shown) + ": stage " + std::to_string(action.stage) +
                      " does not exist; the schedule has stages 0 to " + std::to_string(schedule_.num_stages() - 1));
    }
    const int owner = schedule_.stage_to_rank[static_cast<std::size_t>(action.stage)];
    if (owner != rank) {
      throw PlanError(where(rank, position, shown) + ": stage " + std::to_string(action.stage) + " runs on rank " +
                      std::to_string(owner) + ", not on rank " + std::to_string(rank));
    }
    if (!action.microbatch || *action.microbatch < 0 || *action.microbatch >= microbatches_) {
      throw PlanError(where(rank, position, shown) + ": the microbatch must be 0 to " +
                      std::to_string(microbatches_ - 1) + " (the schedule has " + std::to_string(microbatches_) +
                      " microbatches)");
    }
  }

  void read(int stage, Direction direction, int microbatch, int position, bool first) {
    Uses& u = uses(stage, direction, microbatch);
    if (first && u.first_read == kNone) u.first_read = position;
    u.last_read = std::max(u.last_read, position);
  }

  void visit(int rank, int position, const Action& action, const Action& shown) {
    switch (action.type) {
      case ActionType::recv_f:
      case ActionType::recv_b: {
        check_placement(rank, position, action, shown);
        const Direction direction = action.type == ActionType::recv_f ? Direction::forward : Direction::backward;
        Uses& u = uses(action.stage, direction, *action.microbatch);
        if (u.recv != kNone) {
          throw PlanError(where(rank, position, shown) + ": receives microbatch " + std::to_string(*action.microbatch) +
                          " a second time (first at position " + std::to_string(u.recv) + ")");
        }
        u.recv = position;
        u.recv_action = action;
        return;
      }
      case ActionType::forward:
        check_placement(rank, position, action, shown);
        read(action.stage, Direction::forward, *action.microbatch, position, true);
        return;
      case ActionType::full_backward:
      case ActionType::backward_input:
        check_placement(rank, position, action, shown);
        read(action.stage, Direction::forward, *action.microbatch, position, false);
        read(action.stage, Direction::backward, *action.microbatch, position, true);
        return;
      case ActionType::backward_weight:
        // The weight gradient reads the stage input, and the received gradient too: stage 0 runs
        // its whole backward here, and a later stage's weight step can start from it.
        check_placement(rank, position, action, shown);
        read(action.stage, Direction::forward, *action.microbatch, position, false);
        read(action.stage, Direction::backward, *action.microbatch, position, false);
        return;
      case ActionType::send_f:
      case ActionType::send_b: {
        // What a stage sends on can be the buffer it received (a stage that passes its input
        // through, or its gradient, as in y = x + bias): the send reads it.
        check_placement(rank, position, action, shown);
        const Direction direction = action.type == ActionType::send_f ? Direction::forward : Direction::backward;
        read(action.stage, direction, *action.microbatch, position, false);
        return;
      }
      default: return;  // UNSHARD, RESHARD, REDUCE_GRAD hold no receive buffer
    }
  }

  StageBuffers stage_buffers(int stage, Direction direction) const {
    StageBuffers buffers;
    buffers.rank = schedule_.stage_to_rank[static_cast<std::size_t>(stage)];
    buffers.stage = stage;
    buffers.direction = direction;
    buffers.slots.assign(static_cast<std::size_t>(std::max(0, microbatches_)), std::nullopt);
    for (int microbatch = 0; microbatch < microbatches_; ++microbatch) {
      const Uses& u = uses(stage, direction, microbatch);
      if (u.recv == kNone) continue;
      const std::string reader = direction == Direction::forward ? "an F" : "a B or I";
      if (u.first_read == kNone) {
        throw PlanError(where(buffers.rank, u.recv, u.recv_action) + ": nothing on rank " +
                        std::to_string(buffers.rank) + " reads it; stage " + std::to_string(stage) + " needs " +
                        reader + " for microbatch " + std::to_string(microbatch) + " after this RECV");
      }
      if (u.first_read < u.recv) {
        throw PlanError(where(buffers.rank, u.recv, u.recv_action) + ": stage " + std::to_string(stage) + " runs " +
                        reader + " for microbatch " + std::to_string(microbatch) + " at position " +
                        std::to_string(u.first_read) + ", before the RECV that brings its input");
      }
      buffers.intervals.push_back({microbatch, u.recv, u.last_read});
    }
    std::sort(buffers.intervals.begin(), buffers.intervals.end(),
              [](const LiveInterval& a, const LiveInterval& b) { return a.start < b.start; });
    const std::vector<int> slots = color_intervals(buffers.intervals, buffers.min_slots);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      buffers.slots[static_cast<std::size_t>(buffers.intervals[i].microbatch)] = slots[i];
    }
    return buffers;
  }

  const Schedule& schedule_;
  int microbatches_;
  std::vector<Uses> uses_;
};

}  // namespace

std::string_view to_string(Direction direction) { return direction == Direction::forward ? "F" : "B"; }

std::uint64_t StageBuffers::stock_bytes(std::uint64_t bytes_per_set) const {
  return static_cast<std::uint64_t>(received()) * bytes_per_set;
}

std::uint64_t StageBuffers::pooled_bytes(std::uint64_t bytes_per_set) const {
  return static_cast<std::uint64_t>(min_slots) * bytes_per_set;
}

const StageBuffers& BufferAnalysis::at(int stage, Direction direction) const {
  const std::size_t index = static_cast<std::size_t>(stage) * 2 + (direction == Direction::backward ? 1 : 0);
  if (stage < 0 || index >= stages.size()) {
    throw PlanError("stage " + std::to_string(stage) + " is not in the analysis (it has " +
                    std::to_string(stages.size() / 2) + " stages)");
  }
  return stages[index];
}

BufferAnalysis analyze_receive_buffers(const Schedule& lowered) {
  if (lowered.microbatches < 0) {
    throw PlanError("the schedule has " + std::to_string(lowered.microbatches) + " microbatches; it needs 0 or more");
  }
  for (std::size_t stage = 0; stage < lowered.stage_to_rank.size(); ++stage) {
    const int rank = lowered.stage_to_rank[stage];
    if (rank < 0 || rank >= lowered.num_ranks()) {
      throw PlanError("stage " + std::to_string(stage) + " maps to rank " + std::to_string(rank) +
                      ", but the schedule has ranks 0 to " + std::to_string(lowered.num_ranks() - 1));
    }
  }
  Scanner scanner(lowered);
  scanner.scan();
  return scanner.result();
}

std::vector<int> color_intervals(const std::vector<LiveInterval>& intervals, int& count, int ring_size) {
  std::vector<std::size_t> order(intervals.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return intervals[a].start < intervals[b].start; });
  // Slots whose holder ended: lowest first, or in a ring the one freed longest ago first (its
  // key is the order of release). Busy slots by the position their holder ends.
  using Free = std::pair<long long, int>;  // (key, slot)
  std::priority_queue<Free, std::vector<Free>, std::greater<>> free_slots;
  long long releases = 0;
  for (int slot = 0; slot < ring_size; ++slot) free_slots.emplace(releases++, slot);
  using Busy = std::pair<int, int>;  // (end, slot)
  std::priority_queue<Busy, std::vector<Busy>, std::greater<>> busy;
  std::vector<int> slots(intervals.size(), 0);
  count = 0;
  for (const std::size_t i : order) {
    // Inclusive ends: a holder ending at the very position this one starts still holds. Holders
    // ending at the same position are released lowest slot first.
    while (!busy.empty() && busy.top().first < intervals[i].start) {
      const int slot = busy.top().second;
      free_slots.emplace(ring_size > 0 ? releases++ : slot, slot);
      busy.pop();
    }
    int slot = count;
    if (!free_slots.empty()) {
      slot = free_slots.top().second;
      free_slots.pop();
    } else if (ring_size > 0) {
      throw PlanError("a ring of " + std::to_string(ring_size) + " buffer sets is too small: " +
                      std::to_string(busy.size() + 1) + " buffers are live at position " +
                      std::to_string(intervals[i].start) + "; give a ring of at least the colored minimum");
    } else {
      ++count;
    }
    slots[i] = slot;
    busy.emplace(intervals[i].end, slot);
  }
  if (ring_size > 0) count = ring_size;
  return slots;
}

}  // namespace remat::pipeline
