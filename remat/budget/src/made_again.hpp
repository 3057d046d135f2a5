#pragma once
// What a recomputed region makes again in its call's backward that something other than the call
// then holds, for a plan's step peak (step_model.hpp): its casts of leaves, made again after a
// clear freed the forward's, in a backward inside an autocast block (the cache holds them until the
// next clear); what its ops saved, in a backward run with create_graph=True (the graph that
// backward makes holds them until the profiled step freed them, where it did).

#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace remat::budget::detail {

struct MadeAgain {
  std::uint32_t call = 0;
  std::size_t region = 0;  // in the profile's regions: made again where it is recomputed
  // Alive from `from` to `until` (segments). In the call's backward segments from `beside_from` to
  // `beside_until`, the profiled step used them as it went and recompute makes them again beside:
  // counted above its peak there (a bound, the moment they are freed unknown).
  std::size_t from = 0, until = 0, beside_from = 0, beside_until = 0;
  std::vector<std::uint32_t> ids;
  // Another copy of ids beside one still alive (a second backward with create_graph=True, a copy of
  // the call's output): its bytes are counted where it is alive even where the same storages are.
  bool another_copy = false;
  std::uint64_t bytes = 0;  // of ids
};

class MadeAgainSet {
 public:
  explicit MadeAgainSet(const StepMemory& step);

  // `entry` without its bytes, which this counts; none where `ids` is empty.
  void add(MadeAgain entry);
  // Those of the step's backwards run with create_graph=True (StepCheckpoint::create_graph_backwards):
  // per backward and region, what its ops saved, and its outputs another region of its call saved
  // (where the region is recomputed, that region's backward reads recompute's copy); `regions` gives
  // each call's regions' indexes in the profile.
  void add_graphs_made(const std::vector<std::vector<std::size_t>>& regions);

  // Per entry, whether `choices` makes it again: its region recomputed.
  std::vector<char> made(const std::vector<Choice>& choices) const;
  bool empty() const { return entries_.empty(); }
  const MadeAgain& operator[](std::size_t entry) const { return entries_[entry]; }
  // The entries alive from segment s on, those alive no longer from s on, and call k's.
  const std::vector<std::uint32_t>& beginning(std::size_t s) const { return beginning_[s]; }
  const std::vector<std::uint32_t>& ending(std::size_t s) const { return ending_[s]; }
  const std::vector<std::uint32_t>& of_call(std::size_t k) const { return of_call_[k]; }

 private:
  const StepMemory& step_;
  std::vector<MadeAgain> entries_;
  std::vector<std::vector<std::uint32_t>> beginning_, ending_, of_call_;
};

}  // namespace remat::budget::detail
