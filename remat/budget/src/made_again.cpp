// What recomputed regions make again in a backward that something else then holds (made_again.hpp).

#include "made_again.hpp"

#include <algorithm>
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
    const auto& backwards = call.create_graph_backwards;
    for (std::size_t r = 0; r < call.regions.size(); ++r) {
      std::vector<std::uint32_t> held = call.regions[r].saved;
      for (const std::uint32_t id : call.regions[r].outputs) {
        for (std::size_t other = 0; other < call.regions.size(); ++other) {
          const std::vector<std::uint32_t>& saved = call.regions[other].saved;
          if (other != r && std::find(saved.begin(), saved.end(), id) != saved.end()) {
            held.push_back(id);
            break;
          }
        }
      }
      // Held until the segment the profiled step freed each in (there the graph made and the call,
      // its graph retained, held the same tensors), or to the step's end where it did not. A copy of
      // the call's output is beside the output the caller holds.
      std::map<std::pair<std::size_t, bool>, std::vector<std::uint32_t>> by_until;
      for (const std::uint32_t id : held) {
        const std::int64_t freed = id < step_.freed_in.size() ? step_.freed_in[id] : -1;
        const bool output = std::find(call.outputs.begin(), call.outputs.end(), id) != call.outputs.end();
        by_until[{freed >= 0 ? static_cast<std::size_t>(freed) : step_end, output}].push_back(id);
      }
      for (std::size_t b = 0; b < backwards.size(); ++b) {
        const std::size_t next = b + 1 < backwards.size() ? backwards[b + 1].first : step_end;
        for (const auto& [until_output, ids] : by_until) {
          const auto [until, output] = until_output;
          add({k, regions[k][r], backwards[b].first, until, backwards[b].second, next, ids, b > 0 || output, 0});
        }
      }
    }
  }
}

std::vector<char> MadeAgainSet::made(const std::vector<Choice>& choices) const {
  std::vector<char> made(entries_.size(), 0);
  for (std::size_t e = 0; e < entries_.size(); ++e) made[e] = choices[entries_[e].region] != Choice::save ? 1 : 0;
  return made;
}

}  // namespace remat::budget::detail
