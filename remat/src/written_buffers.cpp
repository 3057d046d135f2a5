#include "written_buffers.hpp"

#include "checkpoint_records.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace remat::detail {
namespace {

// What forwards of each checkpoint (by name) showed of each buffer, by the buffer and its module's
// mode (a buffer an eval forward leaves alone may change in training): a function may hold buffers
// that another checkpoint changes (a closure over the whole model). A buffer once seen changed
// stays so (one changed every k-th step). Holds each buffer weakly: its address is not reused
// while an entry names it. Bounded: past kMostCheckpoints names (made anew per call) all is
// forgotten, and learned again from copies of every buffer.
class SeenBuffers {
 public:
  using Seen = WrittenBuffers::Seen;
  struct Key {
    const c10::TensorImpl* buffer;
    bool training;
    bool operator==(const Key& other) const { return buffer == other.buffer && training == other.training; }
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const {
      return std::hash<const void*>()(key.buffer) ^ static_cast<std::size_t>(key.training);
    }
  };
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> buffer;
    Seen seen;
  };
  struct Entries {
    std::unordered_map<Key, Entry, KeyHash> by_buffer;
    std::size_t pruned_at = 0;
    bool parameter_changed = false;  // a forward changed a parameter: parameters are looked up

    Seen seen(const at::Tensor& buffer, bool training) const {
      const auto found = by_buffer.find(key(buffer, training));
      return found == by_buffer.end() ? Seen::not_yet : found->second.seen;
    }
    void note(const at::Tensor& buffer, bool training, Seen seen) {
      if (by_buffer.size() >= 2 * pruned_at + 64) prune();
      const auto [entry, made] = by_buffer.try_emplace(
          key(buffer, training), Entry{c10::weak_intrusive_ptr<c10::TensorImpl>(buffer.getIntrusivePtr()), seen});
      if (!made) entry->second.seen = seen;
    }

   private:
    void prune() {
      for (auto it = by_buffer.begin(); it != by_buffer.end();) {
        it = it->second.buffer.expired() ? by_buffer.erase(it) : std::next(it);
      }
      pruned_at = by_buffer.size();
    }
  };

  // The checkpoint's entries, valid until the next call (used under lock()).
  Entries& of(const std::string& checkpoint) {
    if (by_checkpoint_.size() >= kMostCheckpoints && by_checkpoint_.find(checkpoint) == by_checkpoint_.end()) {
      by_checkpoint_.clear();
    }
    return by_checkpoint_[checkpoint];
  }
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }

 private:
  static constexpr std::size_t kMostCheckpoints = 4096;
  static Key key(const at::Tensor& buffer, bool training) { return {buffer.unsafeGetTensorImpl(), training}; }

  std::mutex mutex_;
  std::unordered_map<std::string, Entries> by_checkpoint_;
};

SeenBuffers& seen_buffers() {
  static SeenBuffers* seen = new SeenBuffers();  // process lifetime: bodies run on any thread until exit
  return *seen;
}

std::uint32_t version_now(const at::Tensor& t) { return t.unsafeGetTensorImpl()->version_counter().current_version(); }

// The tensor a slot holds (none for no entry or None).
const c10::TensorImpl* impl_of(const std::optional<at::Tensor>& held) {
  return held && held->defined() ? held->unsafeGetTensorImpl() : nullptr;
}

at::Tensor copy_of(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  return t.detach().clone(at::MemoryFormat::Preserve);
}

// Writes `value` into `buffer` and sets its version counter to `version`.
void put(const at::Tensor& buffer, const at::Tensor& value, std::uint32_t version) {
  {
    at::NoGradGuard no_grad;
    buffer.detach().copy_(value);
  }
  c10::VariableVersion counter = buffer.unsafeGetTensorImpl()->version_counter();  // shares the counter
  counter.set_version(version);
}

}  // namespace

std::pair<std::uint32_t, std::uint32_t> WrittenBuffers::Watched::versions() const {
  return {version_now(buffer), changes_with.defined() ? version_now(changes_with) : 0};
}

void WrittenBuffers::forward_began(const std::string& checkpoint, const std::vector<HeldBuffer>& buffers) {
  SeenBuffers& seen = seen_buffers();
  const auto lock = seen.lock();
  const SeenBuffers::Entries& entries = seen.of(checkpoint);
  parameters_.reserve(buffers.size());  // (most of what a module holds: one allocation)
  for (const HeldBuffer& held : buffers) {
    const at::Tensor& buffer = held.tensor;
    if (!buffer.defined() || buffer.layout() != at::kStrided || buffer.is_inference() ||
        !buffer.unsafeGetTensorImpl()->version_counter().enabled()) {
      continue;
    }
    // A parameter forward did not change in place before: its version and data as forward begins (most
    // checkpoints change none, and look none up)
    if (held.parameter && (!entries.parameter_changed || entries.seen(buffer, held.training) != Seen::changed)) {
      Parameter& parameter = parameters_.emplace_back();
      parameter.tensor = buffer;
      parameter.version = version_now(buffer);
      parameter.training = held.training;
      parameter.name = held.name;
      if (buffer.has_storage()) {
        parameter.storage = buffer.storage();
        parameter.offset = buffer.storage_offset();
        parameter.sizes = at::DimVector(buffer.sizes());
        parameter.strides = at::DimVector(buffer.strides());
        parameter.dtype = buffer.scalar_type();
      }
      continue;
    }
    Watched& watched = watched_.emplace_back();
    watched.buffer = buffer;
    watched.training = held.training;
    watched.changes_with = held.changes_with;
    watched.slot = held.slot;
    watched.marked_held = buffer.unsafeGetTensorImpl();
    watched.at_forward = watched.marked = watched.versions();
    watched.seen = entries.seen(buffer, held.training);
    // (A parameter here was seen changed in place: copied as a buffer is)
    watched.parameter = held.parameter;
    if (watched.seen != Seen::unchanged) watched.as_forward_read = copy_of(buffer);
    watched.name = held.name;
  }
}

void WrittenBuffers::save_region_ended(std::size_t save_region) {
  if (recomputing_) return;  // (a save region run again in recompute)
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    Watched& watched = watched_[i];
    const auto versions = watched.versions();
    if (versions != watched.marked) {
      watched.marked = versions;
      after_save_regions_.push_back({save_region, i, copy_of(watched.buffer), versions.first, false});
    }
    if (!watched.slot) continue;
    std::optional<at::Tensor> held = watched.slot->held();
    if (impl_of(held) == watched.marked_held) continue;
    watched.marked_held = impl_of(held);
    if (held && held->defined()) held = copy_of(*held);
    after_save_regions_.push_back({save_region, i, at::Tensor(), 0, true, std::move(held)});
  }
}

bool WrittenBuffers::watches(const at::Tensor& t) const {
  if (!t.defined() || !t.has_storage()) return false;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  return std::any_of(watched_.begin(), watched_.end(), [&](const Watched& watched) {
    return watched.as_forward_read.defined() && watched.buffer.storage().unsafeGetStorageImpl() == storage;
  });
}

void WrittenBuffers::forward_ended(const std::string& checkpoint) {
  SeenBuffers& seen = seen_buffers();
  const auto lock = seen.lock();
  SeenBuffers::Entries& entries = seen.of(checkpoint);
  // A parameter changed for the first time: watched from here, not copied (said below)
  for (Parameter& parameter : parameters_) {
    const at::Tensor& now = parameter.tensor;
    const bool in_place = version_now(now) != parameter.version;
    // Assigned anew (and not changed in place before: the data forward read would be changed too)
    const bool data_assigned = !in_place && parameter.storage && now.has_storage() &&
                               now.storage().unsafeGetStorageImpl() != parameter.storage.unsafeGetStorageImpl();
    if (!data_assigned && !in_place) continue;
    if (in_place) entries.parameter_changed = true;  // (copied as later forwards begin)
    Watched& watched = watched_.emplace_back();
    if (data_assigned) {
      // Forward's data, as it read it: the assignment left that storage alone
      at::NoGradGuard no_grad;
      watched.data_assigned = true;
      watched.as_forward_read = at::empty({0}, now.options().dtype(parameter.dtype));
      watched.as_forward_read.set_(parameter.storage, parameter.offset, parameter.sizes, parameter.strides);
    }
    watched.buffer = std::move(parameter.tensor);
    watched.training = parameter.training;
    watched.parameter = true;
    watched.marked_held = watched.buffer.unsafeGetTensorImpl();
    watched.at_forward = watched.marked = {parameter.version, 0};
    watched.name = std::move(parameter.name);
  }
  parameters_.clear();
  std::vector<std::optional<std::size_t>> index_now(watched_.size());
  std::vector<Watched> kept;  // those changed in place or assigned anew
  std::unordered_set<std::size_t> reshaped;  // changed in shape or dtype: put back only as recompute found them
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    Watched& watched = watched_[i];
    watched.changed = watched.data_assigned || watched.versions() != watched.at_forward;
    // What is learned: a buffer changed, or one seen for the first time left alone (a parameter whose
    // data was assigned anew needs no copy: not learned)
    if (!watched.data_assigned && watched.changed && watched.seen != Seen::changed) {
      entries.note(watched.buffer, watched.training, Seen::changed);
    } else if (!watched.changed && watched.seen == Seen::not_yet) {
      entries.note(watched.buffer, watched.training, Seen::unchanged);
    }
    const c10::TensorImpl* forward_read = watched.buffer.unsafeGetTensorImpl();
    watched.assigned =
        watched.slot && (watched.marked_held != forward_read || impl_of(watched.slot->held()) != forward_read);
    // (A parameter's data assigned anew is read by recompute in the shape forward read it)
    if (watched.changed && !watched.data_assigned && watched.as_forward_read.defined() &&
        (watched.as_forward_read.sizes() != watched.buffer.sizes() ||
         watched.as_forward_read.scalar_type() != watched.buffer.scalar_type())) {
      TORCH_WARN("checkpoint '", checkpoint, "' changed the shape or dtype of the buffer '", watched.name, "' (now ",
                 DroppedMeta::of(watched.buffer, -1).describe(),
                 ") in forward (a lazy module initializing it): this call's recompute reads it as forward left it, "
                 "and leaves it as it found it");
      watched.as_forward_read = at::Tensor();
      reshaped.insert(i);
    }
    if (!watched.changed) watched.as_forward_read = at::Tensor();
    if (!watched.changed && !watched.assigned) continue;
    if (watched.changed && !watched.as_forward_read.defined() && reshaped.count(i) == 0) {
      const std::string what = watched.parameter ? "parameter" : "buffer";
      const std::string since = watched.parameter ? "and parameters are not copied before a forward is seen changing "
                                                    "them"
                                                  : "which its earlier forwards in this mode left alone";
      TORCH_WARN("checkpoint '", checkpoint, "' changed the ", what, " '", watched.name, "' (",
                 DroppedMeta::of(watched.buffer, -1).describe(), ") in place in forward, ", since,
                 ", so the value forward read was not kept: this call's recompute reads the changed value, and its "
                 "gradients may differ from those without checkpointing. From the next call on that value is kept "
                 "and recompute runs from it",
                 watched.parameter ? " (or change it before the checkpointed call, or make it a buffer, which is "
                                     "kept from the first call)"
                                   : "");
    }
    index_now[i] = kept.size();
    kept.push_back(std::move(watched));
  }
  // (A copy after a save region is of a buffer changed or assigned anew; not put in where its shape changed.)
  std::erase_if(after_save_regions_, [&](const AfterSaveRegion& copy) { return reshaped.count(copy.watched) != 0; });
  for (AfterSaveRegion& copy : after_save_regions_) copy.watched = *index_now[copy.watched];
  watched_ = std::move(kept);
}

void WrittenBuffers::recompute_began() {
  recomputing_ = true;
  for (Watched& watched : watched_) {
    if (watched.data_assigned) {
      watched.as_recompute_found = watched.buffer.variable_data();  // forward's new data, put back as it was
    } else if (watched.changed) {
      watched.version_found = version_now(watched.buffer);
      watched.as_recompute_found = copy_of(watched.buffer);
    }
    if (watched.assigned) watched.held_as_recompute_began = watched.slot->held();
  }
  for (const Watched& watched : watched_) {
    if (watched.assigned) watched.slot->hold(watched.buffer);
    if (watched.data_assigned) {
      watched.buffer.set_data(watched.as_forward_read);
    } else if (watched.as_forward_read.defined()) {
      put(watched.buffer, watched.as_forward_read, watched.at_forward.first);
    }
  }
}

void WrittenBuffers::save_region_skipped(std::size_t save_region) {
  if (!recomputing_) return;
  for (const AfterSaveRegion& copy : after_save_regions_) {
    if (copy.save_region != save_region) continue;
    const Watched& watched = watched_[copy.watched];
    if (copy.in_slot) {
      watched.slot->hold(copy.slot_value);
    } else {
      put(watched.buffer, copy.value, copy.version);
    }
  }
}

void WrittenBuffers::recompute_ended() noexcept {
  if (!recomputing_) return;
  recomputing_ = false;
  for (Watched& watched : watched_) {
    try {
      // Recompute remade forward's writes where it left the version forward left (what it found,
      // unless the buffer changed after forward); else (stopped before them, or changed since)
      // what it found goes back, as it does where no version says
      if (watched.data_assigned) {
        watched.buffer.set_data(watched.as_recompute_found);
      } else if (watched.changed &&
                 (watched.changes_with.defined() || version_now(watched.buffer) != watched.version_found)) {
        put(watched.buffer, watched.as_recompute_found, watched.version_found);
      }
      if (watched.assigned) watched.slot->hold(watched.held_as_recompute_began);
    } catch (const std::exception& e) {
      TORCH_WARN("recompute could not put back the buffer '", watched.name, "' as it found it: ", e.what());
    }
    watched.as_recompute_found = at::Tensor();
    watched.held_as_recompute_began.reset();
  }
}

}  // namespace remat::detail
