// Which saved tensors exist right now (saved_registry.hpp), recorded while tracking is on.

#include "saved_registry.hpp"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>

#include <mutex>
#include <unordered_map>

namespace remat::detail {
namespace {

thread_local bool t_tracking = false;

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, SavedEntry> entries;
};

Registry& registry() {
  static auto* instance = new Registry();  // hooks may be destroyed during shutdown
  return *instance;
}

}  // namespace

bool saved_tracking_enabled() { return t_tracking; }
void set_saved_tracking(bool enabled) { t_tracking = enabled; }

SavedEntry entry_for_current_node() {
  SavedEntry entry;
  entry.thread = at::RecordFunction::currentThreadId();
  entry.sequence = at::sequence_number::peek() - 1;
  return entry;
}

void register_saved(const void* owner, SavedEntry entry) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entries[owner] = std::move(entry);
}

void unregister_saved(const void* owner) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entries.erase(owner);
}

std::vector<SavedEntry> saved_entries() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<SavedEntry> out;
  out.reserve(r.entries.size());
  for (const auto& [owner, entry] : r.entries) out.push_back(entry);
  return out;
}

}  // namespace remat::detail
