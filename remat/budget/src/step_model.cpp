// The step's device bytes under a plan (step_model.hpp): what each checkpoint call keeps, as a set
// of storages, then each segment's peak less what the plan no longer keeps of what was alive in it.
//
// Offloaded regions follow remat::CpuOffload (remat/src/cpu_offload.cpp) as plans run it, one
// offloader with prefetch 1: what an offloaded region keeps is copied to the host as its forward
// saves it and leaves the device when the region's forward is done (on a GPU, where the copy runs
// on a stream of its own, the device tensors of the last region packed stay until the next pack
// settles them: counted through the forward of the next checkpoint call that offloads). Backward
// brings a call's copies back at the first unpack of its own tensors or of the next offloading
// call's (prefetch 1: that call's and the one before it), into new device tensors as large as the
// copies (offload_bytes), which stay until the call's backward is done: counted from the first
// segment of that earlier of the two backwards to the end of the call's own.

#include "step_model.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "step_bytes.hpp"

namespace remat::budget::detail {

namespace {

bool contains(const std::vector<std::uint32_t>& set, std::uint32_t id) {
  return std::find(set.begin(), set.end(), id) != set.end();
}

}  // namespace

std::vector<std::vector<std::size_t>> region_indexes(const RegionProfile& profile, const StepMemory& step) {
  std::unordered_map<std::string, std::size_t> exact;
  for (std::size_t r = 0; r < profile.regions.size(); ++r) exact.emplace(profile.regions[r].name, r);
  std::vector<std::vector<std::size_t>> indexes;
  for (const StepCheckpoint& call : step.checkpoints) {
    std::vector<std::size_t>& of_call = indexes.emplace_back();
    for (const StepRegion& region : call.regions) {
      std::size_t found = profile.regions.size();
      if (const auto it = exact.find(region.name); it != exact.end()) {
        found = it->second;
      } else {
        for (std::size_t r = 0; r < profile.regions.size() && found == profile.regions.size(); ++r) {
          if (matches(profile.regions[r].name, region.name)) found = r;
        }
      }
      if (found == profile.regions.size()) {
        throw BudgetError("the profile's step lists region '" + region.name +
                          "', which its regions do not: the "
                          "profile contradicts itself; profile the step again (remat.profile_regions())");
      }
      of_call.push_back(found);
    }
  }
  return indexes;
}

const StepMemory& step_of(const RegionProfile& profile) {
  if (!profile.step) {
    throw BudgetError(
        "the profile has no step memory, so no plan's step peak can be predicted: profile the step "
        "with its tensors counted, CPU tensors inside remat.tag_cpu_tensors() or CUDA tensors under "
        "remat_alloc.install(), then plan by peak_bytes (or plan by budget_bytes, what the checkpoints "
        "keep)");
  }
  return *profile.step;
}

StepModel::StepModel(const RegionProfile& profile, const StepMemory& step)
    : profile_(profile),
      step_(step),
      cuda_(profile.device.rfind("cuda", 0) == 0),
      indexes_(region_indexes(profile, step)),
      made_again_(step) {
  // Outputs of a call that no later call takes as input are held by code outside the
  // checkpoints (a head, a loss): alive while the call is live whatever it keeps.
  const std::size_t calls = step.checkpoints.size();
  held_until_.resize(calls);
  consumed_.resize(calls);
  std::unordered_map<std::uint32_t, std::uint32_t> first_taken_by;  // storage: the first call taking it as input
  for (std::size_t k = calls; k-- > 0;) {
    for (const std::uint32_t id : step.checkpoints[k].inputs) first_taken_by[id] = static_cast<std::uint32_t>(k);
  }
  for (std::size_t k = 0; k < calls; ++k) {
    for (const std::uint32_t id : step.checkpoints[k].outputs) {
      std::int64_t consumer = -1;
      // The first later call taking it: where the first call taking it comes earlier, search on.
      if (const auto it = first_taken_by.find(id); it != first_taken_by.end() && it->second > k) {
        consumer = it->second;
      } else if (it != first_taken_by.end()) {
        for (std::size_t later = k + 1; later < calls && consumer < 0; ++later) {
          if (contains(step.checkpoints[later].inputs, id)) consumer = static_cast<std::int64_t>(later);
        }
      }
      if (consumer >= 0) {
        consumed_[static_cast<std::size_t>(consumer)].emplace_back(static_cast<std::uint32_t>(k),
                                                                    static_cast<std::uint32_t>(held_until_[k].size()));
      }
      held_until_[k].emplace_back(id, consumer);
    }
  }
  // An output made by code outside the call's regions (one it hands on: a mask, positions) that the
  // profiled step freed is held no longer from there; one a region keeps is counted by its sets.
  held_freed_.resize(calls);
  unholding_.resize(step.segments.size());
  for (std::size_t k = 0; k < calls; ++k) {
    held_freed_[k].assign(held_until_[k].size(), step.segments.size());
    for (std::uint32_t entry = 0; entry < held_until_[k].size(); ++entry) {
      const std::uint32_t id = held_until_[k][entry].first;
      if (id >= step.freed_in.size() || step.freed_in[id] < 0) continue;
      const auto freed = static_cast<std::size_t>(step.freed_in[id]);
      const auto& regions = step.checkpoints[k].regions;
      if (freed >= step.segments.size() ||
          std::any_of(regions.begin(), regions.end(), [&](const StepRegion& r) { return contains(r.kept, id); })) {
        continue;
      }
      held_freed_[k][entry] = freed;
      unholding_[freed].emplace_back(static_cast<std::uint32_t>(k), entry);
    }
  }
  // Each storage's makers, grouped by storage: counted, then placed.
  makers_begin_.assign(step.storages.size() + 1, 0);
  for (const StepCheckpoint& call : step.checkpoints) {
    for (const StepRegion& region : call.regions) {
      for (const std::uint32_t id : region.outputs) ++makers_begin_[id + 1];
    }
  }
  for (std::size_t id = 0; id < step.storages.size(); ++id) makers_begin_[id + 1] += makers_begin_[id];
  makers_.resize(makers_begin_.back());
  std::vector<std::size_t> placed(makers_begin_.begin(), makers_begin_.end() - 1);
  for (std::size_t k = 0; k < calls; ++k) {
    for (std::size_t r = 0; r < step.checkpoints[k].regions.size(); ++r) {
      for (const std::uint32_t id : step.checkpoints[k].regions[r].outputs) makers_[placed[id]++] = {k, r};
    }
  }
  // What changes between segments: which calls are live.
  joining_.resize(step.segments.size());
  leaving_.resize(step.segments.size());
  std::vector<char> live(calls, 0), in_segment(calls, 0);
  const std::vector<std::uint32_t>* before = nullptr;
  for (std::size_t s = 0; s < step.segments.size(); ++s) {
    const std::vector<std::uint32_t>& now = step.segments[s].live;
    if (before != nullptr && now == *before) continue;  // most segments: the same calls as the one before
    for (const std::uint32_t k : now) in_segment[k] = 1;
    if (before != nullptr) {
      for (const std::uint32_t k : *before) {
        if (live[k] != 0 && in_segment[k] == 0) {
          live[k] = 0;
          leaving_[s].push_back(k);
        }
      }
    }
    for (const std::uint32_t k : now) {
      if (live[k] == 0) {
        live[k] = 1;
        joining_[s].push_back(k);
      }
    }
    for (const std::uint32_t k : now) in_segment[k] = 0;
    before = &now;
  }
  first_backward_.assign(step.checkpoints.size(), step.segments.size());
  forward_end_.assign(step.checkpoints.size(), 0);
  for (std::size_t s = 0; s < step.segments.size(); ++s) {
    const StepSegment& segment = step.segments[s];
    if (segment.backward >= 0) {
      std::size_t& first = first_backward_[static_cast<std::size_t>(segment.backward)];
      first = std::min(first, s);
    }
    if (segment.forward >= 0) forward_end_[static_cast<std::size_t>(segment.forward)] = s + 1;
  }
  // Where each region's forward began: the segment numbered 2r + 1 of its call's forward (none
  // listed: the step's start).
  std::vector<std::size_t> forward_seen(step.checkpoints.size(), 0);
  std::vector<std::vector<std::size_t>> region_begins;
  for (const StepCheckpoint& call : step.checkpoints) region_begins.emplace_back(call.regions.size(), 0);
  forward_place_.assign(step.segments.size(), 0);
  for (std::size_t s = 0; s < step.segments.size(); ++s) {
    if (step.segments[s].forward < 0) continue;
    const auto k = static_cast<std::size_t>(step.segments[s].forward);
    const std::size_t place = forward_place_[s] = forward_seen[k]++;
    if (place % 2 == 1 && place / 2 < region_begins[k].size()) region_begins[k][place / 2] = s;
  }
  // Autocast's cache frees a region's casts at the first clear after the region began; where the
  // profile saw none, when the step's backward begins, or at its end if that began inside the block.
  const std::size_t backward_begins = first_backward_.empty()
                                          ? step.segments.size()
                                          : *std::min_element(first_backward_.begin(), first_backward_.end());
  const std::size_t unseen = step.autocast_held_in_backward ? step.segments.size() : backward_begins;
  uncaching_.assign(step.segments.size(), {});
  casts_of_call_.assign(step.checkpoints.size(), {});
  for (std::uint32_t k = 0; k < step.checkpoints.size(); ++k) {
    const StepCheckpoint& call = step.checkpoints[k];
    std::size_t& kept = kept_count_.emplace_back(0);
    for (std::size_t r = 0; r < call.regions.size(); ++r) {
      kept += call.regions[r].kept.size();
      if (call.regions[r].autocast_cached.empty()) continue;
      const auto clear =
          std::upper_bound(step.autocast_cleared.begin(), step.autocast_cleared.end(), region_begins[k][r]);
      const std::size_t until = clear != step.autocast_cleared.end() ? *clear : unseen;
      std::vector<std::uint32_t>& entries = casts_of_call_[k];
      auto same = std::find_if(entries.begin(), entries.end(), [&](std::uint32_t e) { return casts_[e].until == until; });
      if (same == entries.end()) {
        entries.push_back(static_cast<std::uint32_t>(casts_.size()));
        casts_.push_back({k, until, {}});
        if (until < step.segments.size()) uncaching_[until].push_back(entries.back());
        same = entries.end() - 1;
      }
      std::vector<std::uint32_t>& ids = casts_[*same].ids;
      ids.insert(ids.end(), call.regions[r].autocast_cached.begin(), call.regions[r].autocast_cached.end());
      // Cleared before a backward that runs inside an autocast block, the casts a recompute makes
      // again stay in the cache until the next clear.
      if (step.autocast_held_in_backward && until <= first_backward_[k] && first_backward_[k] < step.segments.size()) {
        const auto next = std::upper_bound(step.autocast_cleared.begin(), step.autocast_cleared.end(), first_backward_[k]);
        const std::size_t from = first_backward_[k];
        made_again_.add({k, indexes_[k][r], from,
                         next != step.autocast_cleared.end() ? std::size_t{*next} : step.segments.size(), from,
                         step.segments.size(), call.regions[r].autocast_cached, false, 0});
      }
    }
  }
  made_again_.add_graphs_made(indexes_);
  const std::vector<Choice> all_saved(profile.regions.size(), Choice::save);
  saved_sets_ = kept_sets(all_saved, {}, nullptr);
  saved_alive_ = alive_by_segment(
      saved_sets_, nullptr, [](std::size_t, std::vector<std::uint32_t>&) {}, nullptr, nullptr);
}

std::uint64_t StepModel::peak(const std::vector<Choice>& choices, const std::vector<bool>& offloaded,
                              const KeptOps* kept_ops) {
  const std::vector<std::vector<std::uint32_t>> sets = kept_sets(choices, offloaded, kept_ops);
  // In its own backward a call hands its kept ops' outputs to recompute, which lets go of those
  // backward does not need once they are used (as a recompute without kept ops would): there it
  // keeps what it would keep without them, beside what recompute brings back.
  std::vector<std::vector<std::uint32_t>> without_kept_ops;
  if (kept_ops != nullptr) without_kept_ops = kept_sets(choices, offloaded, nullptr);
  const bool offloads = std::find(offloaded.begin(), offloaded.end(), true) != offloaded.end();
  const Offload offload = offloads ? offload_of(offloaded) : Offload{};
  const auto also_alive = [&](std::size_t s, std::vector<std::uint32_t>& ids) {
    const StepSegment& segment = step_.segments[s];
    if (segment.backward >= 0) {
      ids = recomputed_saved(static_cast<std::size_t>(segment.backward), choices);
    } else if (segment.forward >= 0 && kept_ops != nullptr) {
      ids = kept_in_forward(s, choices, *kept_ops);
    }
  };
  const std::vector<char> made = made_again_.made(choices);
  const std::vector<std::uint64_t> alive_in = alive_by_segment(sets, kept_ops != nullptr ? &without_kept_ops : nullptr,
                                                               also_alive, offloads ? &offload : nullptr, &made);
  std::uint64_t peak = 0;
  for (std::size_t s = 0; s < step_.segments.size(); ++s) {
    const StepSegment& segment = step_.segments[s];
    const std::uint64_t alive = alive_in[s];
    std::uint64_t top = segment.peak_bytes;
    if (segment.backward >= 0) {
      top = std::max(top, add_bytes(segment.start_bytes,
                                    recompute_transient(static_cast<std::size_t>(segment.backward), choices)));
      // What recompute makes again beside what the profile used as it went (made_again.hpp)
      for (const std::uint32_t e : made_again_.of_call(static_cast<std::size_t>(segment.backward))) {
        const MadeAgain& again = made_again_[e];
        if (made[e] != 0 && s >= again.beside_from && s < std::min(again.until, again.beside_until)) {
          top = add_bytes(top, again.bytes);
        }
      }
    }
    const std::uint64_t freed = saved_alive_[s] > alive ? saved_alive_[s] - alive : 0;
    const std::uint64_t added = alive > saved_alive_[s] ? alive - saved_alive_[s] : 0;
    peak = std::max(peak, add_bytes(top - std::min(top, freed), added));
  }
  return peak;
}

// What each checkpoint call keeps on the device: the inputs code outside its regions reads; its
// saved regions' kept storages, less the inputs of a saved region that recompute recreates (the
// runtime takes them from recompute); and the inputs recompute reads: those a recomputed region
// reads, and where the call recomputes a region, those code outside the regions reads (recompute
// runs it again; where the profile did not note them, all of them where a recomputed region takes
// something no region made and the call was not given: that code made it from the inputs). An
// offloaded region runs saved (recompute recreates neither it nor its outputs) and keeps here only
// what the offloader leaves as it is (offload_kept); the rest is on the host. A recomputed region
// keeping ops keeps what they made as well.
std::vector<std::vector<std::uint32_t>> StepModel::kept_sets(const std::vector<Choice>& choices,
                                                             const std::vector<bool>& offloaded,
                                                             const KeptOps* kept_ops) const {
  std::vector<std::vector<std::uint32_t>> sets;
  for (std::size_t k = 0; k < step_.checkpoints.size(); ++k) sets.push_back(kept_set(k, choices, offloaded, kept_ops));
  return sets;
}

std::vector<std::uint32_t> StepModel::kept_set(std::size_t k, const std::vector<Choice>& choices,
                                               const std::vector<bool>& offloaded, const KeptOps* kept_ops) const {
  const StepCheckpoint& call = step_.checkpoints[k];
  std::vector<std::uint32_t> set;
  set.reserve(call.kept_inputs.size() + kept_count_[k]);
  set.insert(set.end(), call.kept_inputs.begin(), call.kept_inputs.end());
  const auto saved = [&](std::size_t r) { return choices[indexes_[k][r]] == Choice::save; };
  bool recomputes = false;
  for (std::size_t r = 0; r < call.regions.size(); ++r) recomputes = recomputes || !saved(r);
  if (recomputes && call.body_inputs) set.insert(set.end(), call.body_inputs->begin(), call.body_inputs->end());
  // Whether a region of this call (a saved one, where `only_saved`) has `id` among its outputs.
  const auto made_here = [&](std::uint32_t id, bool only_saved) {
    for (std::size_t m = makers_begin_[id]; m < makers_begin_[id + 1]; ++m) {
      if (makers_[m].first == k && (!only_saved || saved(makers_[m].second))) return true;
    }
    return false;
  };
  for (std::size_t r = 0; r < call.regions.size(); ++r) {
    const StepRegion& region = call.regions[r];
    const std::size_t index = indexes_[k][r];
    if (saved(r)) {
      if (!offloaded.empty() && offloaded[index]) {
        set.insert(set.end(), region.offload_kept.begin(), region.offload_kept.end());
        continue;
      }
      for (const std::uint32_t id : region.kept) {
        // Recompute recreates an input of it that neither the call was given nor a saved region made.
        const bool recreated =
            recomputes && contains(region.inputs, id) && !contains(call.inputs, id) && !made_here(id, true);
        if (!recreated) set.push_back(id);
      }
      continue;
    }
    for (const std::uint32_t id : region.inputs) {
      if (contains(call.inputs, id)) {
        set.push_back(id);
      } else if (!call.body_inputs && !made_here(id, false)) {
        set.insert(set.end(), call.inputs.begin(), call.inputs.end());
      }
    }
    if (kept_ops != nullptr && !(*kept_ops)[index].empty()) {
      add_kept_op_outputs(k, r, (*kept_ops)[index], set);
    }
  }
  return set;
}

void StepModel::add_kept_op_outputs(std::size_t k, std::size_t r, const std::vector<std::uint32_t>& kept,
                                    std::vector<std::uint32_t>& outputs) const {
  const StepRegion& region = step_.checkpoints[k].regions[r];
  for (const std::uint32_t index : kept) {
    // Ops are listed by index, usually all of them: the op with index i is at position i.
    const auto op = index < region.ops.size() && region.ops[index].index == index
                        ? region.ops.begin() + index
                        : std::find_if(region.ops.begin(), region.ops.end(),
                                       [&](const StepOp& o) { return o.index == index; });
    if (op == region.ops.end()) {
      throw BudgetError("the profile's step does not list op " + std::to_string(index) + " of region '" + region.name +
                        "' (checkpoint call " + std::to_string(k) +
                        "), so what keeping it holds through the step is unknown: profile the step with "
                        "remat.profile_regions(ops=True) and its tensors counted, then plan by peak with ops=True");
    }
    outputs.insert(outputs.end(), op->outputs.begin(), op->outputs.end());
  }
}

// The profiled step ran every region saved, so what a region's ops made and its backward does not
// need was freed there; a plan keeping such an op holds it from the region's return on.
std::vector<std::uint32_t> StepModel::kept_in_forward(std::size_t s, const std::vector<Choice>& choices,
                                                      const KeptOps& kept_ops) const {
  const auto k = static_cast<std::size_t>(step_.segments[s].forward);
  std::vector<std::uint32_t> outputs;
  const StepCheckpoint& call = step_.checkpoints[k];
  for (std::size_t r = 0; r < call.regions.size() && forward_place_[s] >= 2 * r + 2; ++r) {
    const std::size_t index = indexes_[k][r];
    if (choices[index] == Choice::save || kept_ops[index].empty()) continue;
    add_kept_op_outputs(k, r, kept_ops[index], outputs);
  }
  return outputs;
}

// What recompute brings back in call k's backward: what the regions it recomputes keep while
// saved, their outputs included (recompute makes them, and code between regions may hold them).
std::vector<std::uint32_t> StepModel::recomputed_saved(std::size_t k, const std::vector<Choice>& choices) const {
  std::vector<std::uint32_t> set;
  const StepCheckpoint& call = step_.checkpoints[k];
  set.reserve(kept_count_[k]);
  for (std::size_t r = 0; r < call.regions.size(); ++r) {
    if (choices[indexes_[k][r]] == Choice::save) continue;
    set.insert(set.end(), call.regions[r].kept.begin(), call.regions[r].kept.end());
  }
  return set;
}

std::uint64_t StepModel::recompute_transient(std::size_t k, const std::vector<Choice>& choices) const {
  std::uint64_t most = 0;
  const StepCheckpoint& call = step_.checkpoints[k];
  for (std::size_t r = 0; r < call.regions.size(); ++r) {
    if (choices[indexes_[k][r]] != Choice::save) most = std::max(most, call.regions[r].transient_bytes);
  }
  return most;
}

StepModel::Offload StepModel::offload_of(const std::vector<bool>& offloaded) const {
  const std::size_t calls = step_.checkpoints.size(), none = step_.segments.size();
  Offload offload;
  offload.back_bytes.assign(calls, 0);
  offload.back_from.assign(calls, none);
  offload.lingering.resize(calls);
  offload.linger_until.assign(calls, none);
  std::vector<std::size_t> offloading;  // the calls that offload, in forward order (the offloader's groups)
  for (std::size_t k = 0; k < calls; ++k) {
    const StepCheckpoint& call = step_.checkpoints[k];
    for (std::size_t r = 0; r < call.regions.size(); ++r) {
      if (!offloaded[indexes_[k][r]]) continue;
      const std::uint64_t bytes = profile_.regions[indexes_[k][r]].offload_bytes;
      offload.back_bytes[k] += std::min(bytes, UINT64_MAX - offload.back_bytes[k]);
      offload.lingering[k] = call.regions[r].kept;  // the last region packed
    }
    if (offload.back_bytes[k] > 0 || !offload.lingering[k].empty()) offloading.push_back(k);
  }
  for (std::size_t i = 0; i < offloading.size(); ++i) {
    const std::size_t k = offloading[i];
    const bool later = i + 1 < offloading.size();
    const std::size_t trigger = later ? offloading[i + 1] : k;
    offload.back_from[k] = std::min(first_backward_[trigger], first_backward_[k]);
    if (!cuda_) {
      offload.lingering[k].clear();
    } else if (later) {
      offload.linger_until[k] = forward_end_[offloading[i + 1]];
    }
  }
  return offload;
}

namespace {

// Bytes of a set of storages, each counted once however many times it is added: a storage is in
// the set while it has been added more often than removed.
class Tally {
 public:
  explicit Tally(const std::vector<std::uint64_t>& bytes) : bytes_(bytes), count_(bytes.size(), 0) {}

  void add(std::uint32_t id) {
    if (count_[id]++ == 0) total_ = add_bytes(total_, bytes_[id]);
  }
  void remove(std::uint32_t id) {
    if (--count_[id] == 0) total_ -= bytes_[id];
  }
  void add(const std::vector<std::uint32_t>& ids) {
    for (const std::uint32_t id : ids) add(id);
  }
  void remove(const std::vector<std::uint32_t>& ids) {
    for (const std::uint32_t id : ids) remove(id);
  }
  bool has(std::uint32_t id) const { return count_[id] > 0; }
  std::uint64_t total() const { return total_; }

 private:
  const std::vector<std::uint64_t>& bytes_;
  std::vector<std::uint32_t> count_;
  std::uint64_t total_ = 0;
};

}  // namespace

// Bytes of the storages alive in each segment because of checkpoints: what the live calls keep,
// the outputs of a live call that code outside holds (until the call taking them is live, or the
// segment the profiled step freed them in), what
// the call whose forward runs took as input, in a call's backward what recompute brings back and
// in a forward what kept ops hold (`also_alive`), and what the offloader holds on the device.
// Until autocast's cache is cleared (casts_), the casts of leaves it holds (autocast_cached)
// stay whatever the plan: a recomputed region frees its weights' casts only when the autocast
// block ends, which a loop's forward runs in. What the live calls hold is tallied as calls join
// and leave, so each segment costs what changes in it.
std::vector<std::uint64_t> StepModel::alive_by_segment(
    const std::vector<std::vector<std::uint32_t>>& sets, const std::vector<std::vector<std::uint32_t>>* in_own_backward,
    const std::function<void(std::size_t, std::vector<std::uint32_t>&)>& also_alive, const Offload* offload,
    const std::vector<char>* made) {
  const std::size_t calls = step_.checkpoints.size();
  Tally held(step_.storages);
  std::vector<char> live(calls, 0), cached(casts_.size(), 0);
  std::vector<std::vector<char>> holding(calls);
  for (std::size_t k = 0; k < calls; ++k) holding[k].assign(held_until_[k].size(), 0);
  std::size_t now = 0;  // the segment being settled
  const auto settle_hold = [&](std::uint32_t k, std::uint32_t entry) {
    const auto& [id, consumer] = held_until_[k][entry];
    const char wanted =
        live[k] != 0 && (consumer < 0 || live[static_cast<std::size_t>(consumer)] == 0) && now < held_freed_[k][entry]
            ? 1
            : 0;
    if (wanted == holding[k][entry]) return;
    holding[k][entry] = wanted;
    wanted != 0 ? held.add(id) : held.remove(id);
  };
  const auto settle_cached = [&](std::uint32_t entry, std::size_t s) {
    const HeldCasts& casts = casts_[entry];
    const char wanted = live[casts.call] != 0 && s < casts.until ? 1 : 0;
    if (wanted == cached[entry]) return;
    cached[entry] = wanted;
    wanted != 0 ? held.add(casts.ids) : held.remove(casts.ids);
  };
  const auto settle_call = [&](std::uint32_t k, std::size_t s) {
    live[k] != 0 ? held.add(sets[k]) : held.remove(sets[k]);
    for (std::uint32_t entry = 0; entry < held_until_[k].size(); ++entry) settle_hold(k, entry);
    for (const auto& [holder, entry] : consumed_[k]) settle_hold(holder, entry);
    for (const std::uint32_t entry : casts_of_call_[k]) settle_cached(entry, s);
  };
  std::vector<std::uint32_t> offloading;  // the calls whose bytes the offloader holds at some point
  if (offload != nullptr) {
    for (std::uint32_t k = 0; k < calls; ++k) {
      if (offload->back_bytes[k] > 0 || !offload->lingering[k].empty()) offloading.push_back(k);
    }
  }
  std::uint64_t copies = 0;  // bytes of made_again_'s other copies alive (MadeAgain::another_copy)
  std::vector<std::uint32_t> stamp(step_.storages.size(), 0), extra_ids;
  std::uint32_t generation = 0;
  std::vector<std::uint64_t> alive(step_.segments.size(), 0);
  for (std::size_t s = 0; s < step_.segments.size(); ++s) {
    const StepSegment& segment = step_.segments[s];
    now = s;
    for (const std::uint32_t k : leaving_[s]) live[k] = 0;
    for (const std::uint32_t k : joining_[s]) live[k] = 1;
    for (const std::uint32_t k : leaving_[s]) settle_call(k, s);
    for (const std::uint32_t k : joining_[s]) settle_call(k, s);
    for (const auto& [k, entry] : unholding_[s]) settle_hold(k, entry);
    for (const std::uint32_t entry : uncaching_[s]) settle_cached(entry, s);
    if (made != nullptr) {
      for (const std::uint32_t e : made_again_.ending(s)) {
        const MadeAgain& again = made_again_[e];
        if ((*made)[e] == 0) continue;
        if (again.another_copy) {
          copies -= again.bytes;
        } else {
          held.remove(again.ids);
        }
      }
      for (const std::uint32_t e : made_again_.beginning(s)) {
        const MadeAgain& again = made_again_[e];
        if ((*made)[e] == 0) continue;
        if (again.another_copy) {
          copies = add_bytes(copies, again.bytes);
        } else {
          held.add(again.ids);
        }
      }
    }
    const bool swapped = in_own_backward != nullptr && segment.backward >= 0 &&
                         live[static_cast<std::size_t>(segment.backward)] != 0;
    if (swapped) {
      held.remove(sets[static_cast<std::size_t>(segment.backward)]);
      held.add((*in_own_backward)[static_cast<std::size_t>(segment.backward)]);
    }
    // What else the segment holds, each storage once and only where the live calls do not hold it.
    ++generation;
    std::uint64_t extra = 0;
    const auto add = [&](std::uint32_t id) {
      if (!held.has(id) && stamp[id] != generation) {
        stamp[id] = generation;
        extra = add_bytes(extra, step_.storages[id]);
      }
    };
    if (segment.forward >= 0) {
      for (const std::uint32_t id : step_.checkpoints[static_cast<std::size_t>(segment.forward)].inputs) add(id);
    }
    extra_ids.clear();
    also_alive(s, extra_ids);
    for (const std::uint32_t id : extra_ids) add(id);
    for (const std::uint32_t k : offloading) {
      if (live[k] == 0) continue;
      if (s >= offload->back_from[k]) {
        extra = add_bytes(extra, offload->back_bytes[k]);  // new tensors: beside any storage still alive
      } else if (s < offload->linger_until[k]) {
        for (const std::uint32_t id : offload->lingering[k]) add(id);
      }
    }
    alive[s] = add_bytes(add_bytes(held.total(), extra), copies);
    if (swapped) {
      held.remove((*in_own_backward)[static_cast<std::size_t>(segment.backward)]);
      held.add(sets[static_cast<std::size_t>(segment.backward)]);
    }
  }
  return alive;
}

}  // namespace remat::budget::detail
