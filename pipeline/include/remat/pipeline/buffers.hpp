#pragma once
// Receive-buffer lifetimes of a lowered schedule and their slots: which microbatches can
// share one real buffer set on a stage, derived from the schedule alone (any schedule,
// generated or loaded from CSV).
//
// A buffer is live from its RECV until the last compute on that rank that reads it:
// - F (activations received by stage s for microbatch m): through the last of s's F, B, I,
//   W and SEND_F for m (recompute in B and the weight gradient in W read the stage input; a
//   stage that passes its input through sends the buffer itself);
// - B (gradients received by stage s for microbatch m): through the last of s's B, I, W and
//   SEND_B for m (stage 0 runs its whole backward at W under the I/W split, and the gradient a
//   stage sends back can be the buffer it received, as in y = x + bias).
// Compute inside an OVERLAP_F_B container counts at the container's position.
// Both ends are inclusive positions in the rank's order (idle steps count as positions):
// a slot is busy through the consumer, and free for a RECV positioned after it.

#include <remat/pipeline/schedule.hpp>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace remat::pipeline {

// F = activations received from the previous stage, B = gradients from the next one.
enum class Direction { forward, backward };
std::string_view to_string(Direction direction);  // "F" or "B"

struct LiveInterval {
  int microbatch = 0;
  int start = 0;  // position of the RECV in its rank's order
  int end = 0;    // position of the last compute that reads the buffer (inclusive)
};

// One stage's receive buffers in one direction.
struct StageBuffers {
  int rank = 0;
  int stage = 0;
  Direction direction = Direction::forward;
  std::vector<LiveInterval> intervals;    // in start order; empty when the stage receives nothing
  std::vector<std::optional<int>> slots;  // indexed by microbatch; nullopt = not received
  int min_slots = 0;                      // the colored minimum (0 when nothing is received)

  int received() const { return static_cast<int>(intervals.size()); }
  // One buffer set per microbatch received (what stock runtimes allocate) against one per slot.
  std::uint64_t stock_bytes(std::uint64_t bytes_per_set) const;
  std::uint64_t pooled_bytes(std::uint64_t bytes_per_set) const;
};

// Every stage in both directions, ordered by stage, F before B.
struct BufferAnalysis {
  int microbatches = 0;
  std::vector<StageBuffers> stages;

  const StageBuffers& at(int stage, Direction direction) const;
};

// Throws PlanError naming the rank, position and action when a RECV is on the wrong rank,
// repeats, or has no compute after it that reads the buffer.
BufferAnalysis analyze_receive_buffers(const Schedule& lowered);

// Slots for intervals by first fit in start order (optimal for intervals: the count equals the
// most buffers live at once). Returns each interval's slot, in the order given; `count` gets
// the number of slots used. With a ring larger than that (ring_size > 0), each interval takes
// the slot freed longest ago instead of the lowest free one, so spare slots lengthen the time
// between a slot's release and its reuse; `count` is then ring_size. Throws PlanError when
// ring_size is above 0 but below the most buffers live at once.
std::vector<int> color_intervals(const std::vector<LiveInterval>& intervals, int& count, int ring_size = 0);

}  // namespace remat::pipeline
