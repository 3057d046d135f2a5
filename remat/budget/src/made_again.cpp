// What recomputed regions make again in a backward that something else then holds (made_again.hpp).

#include "made_again.hpp"

#include <map>
#include <utility>

#include "step_bytes.hpp"

namespace remat::budget::detail {

MadeAgainSet::MadeAgainSet(const StepMemory& step)
    : step_(step), beginning_(step.segments.size()), ending_(step.segments.size()), of_call_(step.checkpoints.size()) {}

void MadeAgainSet::add(MadeAgain entry) {
  if (entry.ids.empty() || entry.from >= entry.until || entry.from >= step_.segments.size()) return;
  for (const std::uint32_t id : entry.ids) entry.bytes = add_bytes(entry.bytes, step_.storages[id]);
  const auto index = static_cast<std::uint32_t>(entries_.size());
  beginning_[entry.from].push_back(index);
  if (entry.until < step_.segments.size()) ending_[entry.until].push_back(index);
  of_call_[entry.call].push_back(index);
  entries_.push_back(std::move(entry));
}

void MadeAgainSet::add_graphs_made(const std::vector<std::vector<std::size_t>>& regions) {
  const std::size_t step_end = step_.segments.size();
  for (std::uint32_t k = 0; k < step_.checkpoints.size(); ++k) {
    const StepCheckpoint& call = step_.checkpoints[k];
    if (!call.create_graph_backward) continue;
    const auto [from, ended] = *call.create_graph_backward;
    for (std::size_t r = 0; r < call.regions.size(); ++r) {
      // Held until the segment the profiled step freed each in (there the graph made and the call,
      // its graph retained, held the same tensors), or to the step's end where it did not.
      std::map<std::size_t, std::vector<std::uint32_t>> by_until;
      for (const std::uint32_t id : call.regions[r].saved) {
        const std::int64_t freed = id < step_.freed_in.size() ? step_.freed_in[id] : -1;
        by_until[freed > std::int64_t{from} ? static_cast<std::size_t>(freed) : step_end].push_back(id);
      }
      for (auto& [until, ids] : by_until) add({k, regions[k][r], from, until, ended, std::move(ids), 0});
    }
  }
}

std::vector<char> MadeAgainSet::made(const std::vector<Choice>& choices) const {
  std::vector<char> made(entries_.size(), 0);
  for (std::size_t e = 0; e < entries_.size(); ++e) made[e] = choices[entries_[e].region] != Choice::save ? 1 : 0;
  return made;
}

}  // namespace remat::budget::detail
