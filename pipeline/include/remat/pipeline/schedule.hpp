#pragma once
// A pipeline schedule: for every rank, its actions in execution order. An empty step
// (std::nullopt) is an idle slot, as a None in PyTorch's pipeline_order.

#include <remat/pipeline/action.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remat::pipeline {

using RankOrder = std::vector<std::optional<Action>>;

struct Schedule {
  std::vector<RankOrder> ranks;    // indexed by rank
  std::vector<int> stage_to_rank;  // indexed by stage: the rank that runs it
  int microbatches = 0;

  int num_ranks() const { return static_cast<int>(ranks.size()); }
  int num_stages() const { return static_cast<int>(stage_to_rank.size()); }
};

// PyTorch's two CSV forms: compute actions only, or lowered with SEND/RECV (and
// UNSHARD/RESHARD/REDUCE_GRAD where a schedule has them).
enum class CsvFormat { compute_only, compute_comms };

}  // namespace remat::pipeline
