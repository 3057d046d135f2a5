#pragma once
// A receive-buffer ring plan for a lowered schedule: per rank, stage and direction, the
// colored minimum, each microbatch's slot, NeMo's closed form where it applies (1F1B) with
// its safety verdict, the ring the runtime will use, and stock against pooled bytes.
// Rendered as text for people and as a `pipeline-plan` dump (schemas/pipeline-plan.schema.json).

#include <remat/pipeline/buffers.hpp>
#include <remat/pipeline/schedule.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::pipeline {

struct PlanOptions {
  // The generator's name ("1f1b", "gpipe", ...); empty for a schedule loaded from CSV. NeMo's
  // closed form applies where schedule_supports_recv_pool(schedule_name) holds.
  std::string schedule_name;
  // How the schedule was lowered ("add-send-recv", "runtime"); empty when it came lowered.
  // Recorded in the plan: slots hold for that order only.
  std::string lowering;
  // Extra buffer sets beyond 1F1B's in-flight depth in NeMo's closed form (its default is 2).
  // The colored minimum is exact for the schedule's order, so slack does not enlarge it.
  int slack = 2;
  // Bytes of one buffer set (every tensor a stage receives for one microbatch in one
  // direction); nullopt = count sets only.
  std::optional<std::uint64_t> buffer_bytes;
  // Where NeMo's closed form applies and is safe, the ring is its size (NeMo's behaviour);
  // false = the colored minimum everywhere (remat.pipelining.pool_recv_buffers).
  bool use_closed_form = true;
  // Spare buffer sets in every colored ring beyond the colored minimum (at most one set per
  // microbatch received); with spares, each microbatch takes the slot freed longest ago.
  int spare_sets = 0;
};

// NeMo's ring for one stage, max(2, min(M, S - s + slack)), against the colored minimum.
struct ClosedFormRing {
  int size = 0;
  bool safe = false;  // size >= the colored minimum; an unsafe ring reuses a live buffer
};

struct StagePlan {
  int rank = 0;
  int stage = 0;
  Direction direction = Direction::forward;
  int received = 0;                           // microbatches received in this direction: 0 or M
  int min_slots = 0;                          // the colored minimum
  std::vector<std::optional<int>> slots;      // indexed by microbatch; nullopt = not received
  std::optional<ClosedFormRing> closed_form;  // 1F1B only, where the stage receives
  // The ring the runtime uses: NeMo's closed form where it applies and is safe (at most one
  // set per microbatch received: NeMo keeps stock buffers when its ring would be as large),
  // otherwise the colored minimum. nullopt where the stage receives nothing.
  std::optional<int> ring_size;

  int stock_sets() const { return received; }
  int pooled_sets() const { return ring_size.value_or(0); }
  std::optional<std::uint64_t> stock_bytes;   // stock_sets() * buffer bytes
  std::optional<std::uint64_t> pooled_bytes;  // pooled_sets() * buffer bytes
};

// One ring per rank and direction shared by all of the rank's stages that receive in that
// direction (interleaved and V schedules hold several stages per rank): the colored minimum of
// their live intervals together, which is at most the sum of the per-stage rings. It holds
// where those stages receive buffers of the same shapes.
struct SharedRing {
  int rank = 0;
  Direction direction = Direction::forward;
  std::vector<int> stages;                             // the rank's stages that receive, ascending
  int min_slots = 0;                                   // sets in the shared ring
  int separate_slots = 0;                              // the per-stage rings' sets together
  std::vector<std::vector<std::optional<int>>> slots;  // per stage (as in `stages`), per microbatch
};

struct PipelinePlan {
  std::string schedule_name;  // empty for a custom schedule
  std::string lowering;       // empty when the schedule came lowered
  int ranks = 0;
  int stages = 0;
  int microbatches = 0;
  int slack = 0;
  int spare_sets = 0;
  std::optional<std::uint64_t> buffer_bytes;
  bool closed_form_applies = false;
  bool closed_form_used = false;   // closed_form_applies and PlanOptions::use_closed_form
  std::vector<StagePlan> entries;  // every stage in both directions, by rank, then stage, F before B
  std::vector<SharedRing> shared;  // by rank, F before B, where a rank has a stage receiving

  int stock_sets() const;
  int pooled_sets() const;
  int shared_sets() const;  // the shared rings' sets together
  std::optional<std::uint64_t> stock_bytes() const;
  std::optional<std::uint64_t> pooled_bytes() const;
  int unsafe_closed_forms() const;
  // Every stage that receives in `direction` needs one slot per microbatch (GPipe's
  // activations: every forward runs before any backward).
  bool pool_saves_nothing(Direction direction) const;
};

// Throws PlanError for a negative slack or spare count and for what analyze_receive_buffers refuses.
PipelinePlan plan_receive_buffers(const Schedule& lowered, const PlanOptions& options);

// A table per rank, stage and direction, the unsafe closed forms with their safe sizes, and
// a total line.
std::string format_plan(const PipelinePlan& plan);

// The `pipeline-plan` dump: the common header, the plan's parameters, `entries` and `totals`.
std::string plan_to_json(const PipelinePlan& plan);

}  // namespace remat::pipeline
