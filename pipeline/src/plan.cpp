#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/plan.hpp>
#include <remat/pipeline/ring.hpp>

#include "detail/schedule_record.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace remat::pipeline {
namespace {

std::optional<std::uint64_t> times(int sets, const std::optional<std::uint64_t>& bytes_per_set) {
  if (!bytes_per_set) return std::nullopt;
  const auto count = static_cast<std::uint64_t>(sets);
  if (count != 0 && *bytes_per_set > UINT64_MAX / count) {
    throw PlanError(std::to_string(sets) + " buffer sets of " + std::to_string(*bytes_per_set) +
                    " bytes do not fit in 64 bits; give the size of one buffer set in bytes");
  }
  return count * *bytes_per_set;
}

StagePlan stage_plan(const StageBuffers& buffers, const PipelinePlan& plan) {
  StagePlan entry;
  entry.rank = buffers.rank;
  entry.stage = buffers.stage;
  entry.direction = buffers.direction;
  entry.received = buffers.received();
  entry.min_slots = buffers.min_slots;
  entry.slots = buffers.slots;
  if (entry.received > 0) {
    entry.ring_size = entry.min_slots;
    if (plan.spare_sets > 0 && !plan.closed_form_used) {
      // min(received, min + spares), without overflow for a large spare count.
      entry.ring_size = entry.min_slots + std::min(plan.spare_sets, entry.received - entry.min_slots);
      int count = 0;
      const std::vector<int> ring = color_intervals(buffers.intervals, count, *entry.ring_size);
      for (std::size_t i = 0; i < ring.size(); ++i) {
        entry.slots[static_cast<std::size_t>(buffers.intervals[i].microbatch)] = ring[i];
      }
    }
    if (plan.closed_form_applies) {
      ClosedFormRing ring;
      ring.size = nemo_ring_size(plan.stages, entry.stage, plan.microbatches, plan.slack);
      ring.safe = ring.size >= entry.min_slots;
      entry.closed_form = ring;
      if (ring.safe && plan.closed_form_used) entry.ring_size = std::min(ring.size, entry.received);
    }
  }
  entry.stock_bytes = times(entry.stock_sets(), plan.buffer_bytes);
  entry.pooled_bytes = times(entry.pooled_sets(), plan.buffer_bytes);
  return entry;
}

SharedRing shared_ring(const BufferAnalysis& analysis, int rank, Direction direction) {
  SharedRing ring;
  ring.rank = rank;
  ring.direction = direction;
  std::vector<LiveInterval> together;
  std::vector<std::size_t> owner;  // index into ring.stages of each interval in `together`
  for (const StageBuffers& buffers : analysis.stages) {
    if (buffers.rank != rank || buffers.direction != direction || buffers.received() == 0) continue;
    ring.stages.push_back(buffers.stage);
    ring.separate_slots += buffers.min_slots;
    for (const LiveInterval& interval : buffers.intervals) {
      together.push_back(interval);
      owner.push_back(ring.stages.size() - 1);
    }
  }
  ring.slots.assign(ring.stages.size(),
                    std::vector<std::optional<int>>(static_cast<std::size_t>(analysis.microbatches), std::nullopt));
  const std::vector<int> slots = color_intervals(together, ring.min_slots);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    ring.slots[owner[i]][static_cast<std::size_t>(together[i].microbatch)] = slots[i];
  }
  return ring;
}

}  // namespace

int PipelinePlan::shared_sets() const {
  int sets = 0;
  for (const SharedRing& ring : shared) sets += ring.min_slots;
  return sets;
}

int PipelinePlan::stock_sets() const {
  int sets = 0;
  for (const StagePlan& entry : entries) sets += entry.stock_sets();
  return sets;
}

int PipelinePlan::pooled_sets() const {
  int sets = 0;
  for (const StagePlan& entry : entries) sets += entry.pooled_sets();
  return sets;
}

std::optional<std::uint64_t> PipelinePlan::stock_bytes() const { return times(stock_sets(), buffer_bytes); }
std::optional<std::uint64_t> PipelinePlan::pooled_bytes() const { return times(pooled_sets(), buffer_bytes); }

int PipelinePlan::unsafe_closed_forms() const {
  return static_cast<int>(std::count_if(entries.begin(), entries.end(), [](const StagePlan& entry) {
    return entry.closed_form && !entry.closed_form->safe;
  }));
}

bool PipelinePlan::pool_saves_nothing(Direction direction) const {
  bool receives = false;
  for (const StagePlan& entry : entries) {
    if (entry.received == 0 || entry.direction != direction) continue;
    receives = true;
    if (entry.min_slots < entry.received) return false;
  }
  return receives;
}

PipelinePlan plan_receive_buffers(const Schedule& lowered, const PlanOptions& options) {
  if (options.slack < 0) {
    throw PlanError("slack " + std::to_string(options.slack) +
                    " is negative; give 0 or more extra buffer sets beyond the in-flight depth (NeMo's default is 2)");
  }
  if (options.spare_sets < 0) {
    throw PlanError("spare sets " + std::to_string(options.spare_sets) +
                    " is negative; give 0 or more buffer sets beyond the colored minimum");
  }
  PipelinePlan plan;
  detail::record_schedule(plan, options, lowered);
  plan.spare_sets = options.spare_sets;
  plan.slack = options.slack;
  plan.buffer_bytes = options.buffer_bytes;
  plan.closed_form_applies = schedule_supports_recv_pool(options.schedule_name);
  plan.closed_form_used = plan.closed_form_applies && options.use_closed_form;
  const BufferAnalysis analysis = analyze_receive_buffers(lowered);
  for (const StageBuffers& buffers : analysis.stages) plan.entries.push_back(stage_plan(buffers, plan));
  std::stable_sort(plan.entries.begin(), plan.entries.end(), [](const StagePlan& a, const StagePlan& b) {
    return std::tie(a.rank, a.stage) < std::tie(b.rank, b.stage);
  });
  for (int rank = 0; rank < plan.ranks; ++rank) {
    for (const Direction direction : {Direction::forward, Direction::backward}) {
      SharedRing ring = shared_ring(analysis, rank, direction);
      if (!ring.stages.empty()) plan.shared.push_back(std::move(ring));
    }
  }
  return plan;
}

}  // namespace remat::pipeline
