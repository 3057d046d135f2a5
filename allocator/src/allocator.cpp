#include <remat/alloc/allocator.hpp>
#include <remat/alloc/cuda_backend.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/host_backend.hpp>

#include "fork_safety.hpp"
#include "message_text.hpp"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace remat::alloc {
namespace {

// A registered out-of-memory observer. Dispatch calls a snapshot of the list, holding each entry
// by shared_ptr, so an observer removed meanwhile is marked and skipped, and one a thread is
// inside stays alive until that call returned. Removal never waits for another thread: it may
// run inside an observer that thread needs to finish (two observers removing each other).
struct ObserverEntry {
  explicit ObserverEntry(OomObserver observer) : call(std::move(observer)) {}
  OomObserver call;
  bool removed = false;  // guarded by Registry::observer_mutex
};

// Whether this thread is calling observers: an observer's own allocation that fails does not
// call the observers again, a recursion that would have no end (each call fails the same way);
// its error reaches the observer alone.
thread_local bool t_notifying = false;

struct Registry {
  std::mutex mutex;
  bool configured = false;
  Config config;
  std::array<std::atomic<CachingAllocator*>, kMaxDevices> allocators{};
  std::atomic<CachingAllocator*> separate_cpu_allocator{nullptr};  // when devices are CUDA
  std::atomic<CachingAllocator*> cpu_allocator{nullptr};           // what cpu_allocator() returns
  std::atomic<CachingAllocator*> pinned_host_allocator{nullptr};   // when devices are CUDA
  std::mutex observer_mutex;
  std::map<int, std::shared_ptr<ObserverEntry>> observers;
  int next_observer_id = 1;
};

void hold_everything_for_fork();
void release_everything_after_fork();

// Never destroyed: PyTorch may free tensors during interpreter shutdown, after static
// destructors would have run.
Registry& registry() {
  static auto* instance = [] {
    auto* created = new Registry();
    pthread_atfork(hold_everything_for_fork, release_everything_after_fork, release_everything_after_fork);
    return created;
  }();
  return *instance;
}

// The registry's allocators, each once (the CPU allocator may be device 0's). Stable while
// r.mutex is held: allocators are created under it.
std::vector<CachingAllocator*> registered_allocators(Registry& r) {
  std::vector<CachingAllocator*> out;
  for (auto& slot : r.allocators) {
    if (CachingAllocator* allocator = slot.load(std::memory_order_relaxed)) out.push_back(allocator);
  }
  CachingAllocator* separate = r.separate_cpu_allocator.load(std::memory_order_relaxed);
  if (separate != nullptr) out.push_back(separate);
  CachingAllocator* pinned = r.pinned_host_allocator.load(std::memory_order_relaxed);
  if (pinned != nullptr) out.push_back(pinned);
  return out;
}

// Fork handlers (fork_safety.hpp), in the order every other path takes these locks:
// the registry, then allocators, then the tag tables; observers last.
void hold_everything_for_fork() {
  Registry& r = registry();
  r.mutex.lock();
  for (CachingAllocator* allocator : registered_allocators(r)) allocator->hold_for_fork();
  detail::hold_tag_tables_for_fork();
  r.observer_mutex.lock();
}

void release_everything_after_fork() {
  Registry& r = registry();
  r.observer_mutex.unlock();
  detail::release_tag_tables_after_fork();
  const std::vector<CachingAllocator*> allocators = registered_allocators(r);
  for (auto it = allocators.rbegin(); it != allocators.rend(); ++it) (*it)->release_after_fork();
  r.mutex.unlock();
}

// Calls `entry` unless it was removed, outside the lock.
void call_observer(Registry& r, ObserverEntry& entry, const OomEvent& event) {
  {
    std::lock_guard lock(r.observer_mutex);
    if (entry.removed) return;
  }
  try {
    entry.call(event);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat: an out-of-memory observer threw: %s (ignored)\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "remat: an out-of-memory observer threw a non-standard exception (ignored)\n");
  }
}

void notify_observers(const OomEvent& event) {
  if (t_notifying) return;
  Registry& r = registry();
  std::vector<std::shared_ptr<ObserverEntry>> observers;
  {
    std::lock_guard lock(r.observer_mutex);
    for (const auto& [id, entry] : r.observers) observers.push_back(entry);
  }
  t_notifying = true;
  for (const std::shared_ptr<ObserverEntry>& entry : observers) call_observer(r, *entry, event);
  t_notifying = false;
}

BackendKind resolve(BackendKind kind) {
  if (kind != BackendKind::automatic) return kind;
  return cuda_device_available() ? BackendKind::cuda : BackendKind::host;
}

std::unique_ptr<Backend> make_backend(const Config& config, int device) {
  if (resolve(config.backend) == BackendKind::cuda) return make_cuda_backend(device);
  return std::make_unique<HostBackend>(config.host_capacity_bytes, device);
}

// An oom_dump_dir the process cannot write reports into is said when it is set, not only at the
// OOM whose report it loses.
void say_if_unwritable(const Config& config, const char* source) {
  if (config.oom_dump_dir.empty()) return;
  struct stat status {};
  const char* problem = nullptr;
  if (::stat(config.oom_dump_dir.c_str(), &status) != 0)
    problem = "does not exist";
  else if (!S_ISDIR(status.st_mode))
    problem = "is not a directory";
  else if (::access(config.oom_dump_dir.c_str(), W_OK | X_OK) != 0)
    problem = "is not writable by this process";
  if (problem == nullptr) return;
  std::fprintf(stderr,
               "remat: oom_dump_dir %s (%s) %s: no OOM report can be written there until it is; create it, or "
               "name a directory this process can write\n",
               detail::quote(config.oom_dump_dir).c_str(), source, problem);
}

// Callers hold r.mutex.
const Config& configured_locked(Registry& r) {
  if (!r.configured) {
    r.config = Config::from_environment();
    r.configured = true;
    say_if_unwritable(r.config, "REMAT_ALLOC_CONF");
  }
  return r.config;
}

// device_allocator's rare paths, out of line so that its common one (every allocation and free
// through the C ABI) saves no registers: a bad index, or the device's first use.
[[gnu::noinline]] CachingAllocator& created_device_allocator(int device) {
  if (device < 0 || device >= kMaxDevices) {
    throw InvalidArgumentError("device " + std::to_string(device) + " is out of range; pass a device index in [0, " +
                               std::to_string(kMaxDevices) + ")");
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (CachingAllocator* existing = r.allocators[device].load(std::memory_order_relaxed)) return *existing;
  const Config& config = configured_locked(r);
  auto* created = new CachingAllocator(make_backend(config, device), config);
  created->set_oom_handler(notify_observers);
  r.allocators[device].store(created, std::memory_order_release);
  return *created;
}

}  // namespace

CachingAllocator& device_allocator(int device) {
  if (device >= 0 && device < kMaxDevices) {
    if (CachingAllocator* existing = registry().allocators[device].load(std::memory_order_acquire)) return *existing;
  }
  return created_device_allocator(device);
}

CachingAllocator& cpu_allocator() {
  // Resolved once: every CPU tensor allocation comes through here.
  Registry& r = registry();
  if (CachingAllocator* resolved = r.cpu_allocator.load(std::memory_order_acquire)) return *resolved;
  CachingAllocator* chosen = nullptr;
  if (effective_backend() == BackendKind::host) {
    chosen = &device_allocator(0);
  } else {
    std::lock_guard lock(r.mutex);
    chosen = r.separate_cpu_allocator.load(std::memory_order_relaxed);
    if (chosen == nullptr) {
      const Config& config = configured_locked(r);
      chosen = new CachingAllocator(std::make_unique<HostBackend>(config.host_capacity_bytes, 0), config);
      chosen->set_oom_handler(notify_observers);
      r.separate_cpu_allocator.store(chosen, std::memory_order_release);
    }
  }
  CachingAllocator* expected = nullptr;
  if (!r.cpu_allocator.compare_exchange_strong(expected, chosen, std::memory_order_acq_rel)) return *expected;
  return *chosen;
}

CachingAllocator& pinned_host_allocator() {
  Registry& r = registry();
  if (CachingAllocator* existing = r.pinned_host_allocator.load(std::memory_order_acquire)) return *existing;
  if (effective_backend() == BackendKind::host) return cpu_allocator();
  std::lock_guard lock(r.mutex);
  CachingAllocator* created = r.pinned_host_allocator.load(std::memory_order_relaxed);
  if (created == nullptr) {
    const Config& config = configured_locked(r);
    created = new CachingAllocator(make_pinned_host_backend(config.host_capacity_bytes), config);
    created->set_oom_handler(notify_observers);
    r.pinned_host_allocator.store(created, std::memory_order_release);
  }
  return *created;
}

namespace {

// The configuration configure() applies `text` over. A malformed REMAT_ALLOC_CONF fails
// every other call, naming the bad key; an explicit configure() is how a process recovers,
// so it starts from the defaults then (and says so) instead of failing too.
Config base_for_configure(Registry& r, std::string_view text) {
  try {
    return configured_locked(r);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "remat: %s; remat_configure(%s) applies over the defaults instead\n", e.what(),
                 detail::quote(text).c_str());
    return Config{};
  }
}

}  // namespace

void configure(std::string_view text) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const Config current = base_for_configure(r, text);
  Config next = Config::parse(text, current, "remat_configure");
  if (next.oom_dump_dir != current.oom_dump_dir) say_if_unwritable(next, "remat_configure");
  const bool host_capacity_changes = next.host_capacity_bytes != current.host_capacity_bytes;
  const bool backend_changes = resolve(next.backend) != resolve(current.backend) || host_capacity_changes;
  std::vector<CachingAllocator*> existing;
  for (auto& slot : r.allocators) {
    if (CachingAllocator* allocator = slot.load(std::memory_order_relaxed)) existing.push_back(allocator);
  }
  // Beside CUDA devices: the CPU tensors' allocator and the pinned host one, which take the
  // settings too (host_capacity_mb sizes both).
  CachingAllocator* const separate_cpu = r.separate_cpu_allocator.load(std::memory_order_relaxed);
  CachingAllocator* const pinned = r.pinned_host_allocator.load(std::memory_order_relaxed);
  std::vector<std::pair<CachingAllocator*, std::string>> replaced;  // with what it is called in errors
  if (backend_changes) {
    for (CachingAllocator* allocator : existing) {
      replaced.emplace_back(allocator, "device " + std::to_string(allocator->device()));
    }
  }
  if (host_capacity_changes) {
    if (separate_cpu != nullptr) replaced.emplace_back(separate_cpu, "the CPU tensors' allocator");
    if (pinned != nullptr) replaced.emplace_back(pinned, "the pinned host allocator");
  }
  // Check every allocator before switching any, so a refusal leaves all of them as they were.
  for (const auto& [allocator, what] : replaced) {
    const std::int64_t live = allocator->stats().allocations.current;
    if (live != 0) {
      throw StateError("cannot change backend or host_capacity_mb while " + what + " has " + std::to_string(live) +
                       " live blocks; configure before the first allocation, or free everything first");
    }
  }
  for (CachingAllocator* allocator : existing) {
    if (backend_changes) allocator->replace_backend(make_backend(next, allocator->device()), next);
    else allocator->apply_config(next);
  }
  if (separate_cpu != nullptr && host_capacity_changes) {
    separate_cpu->replace_backend(std::make_unique<HostBackend>(next.host_capacity_bytes, 0), next);
  } else if (separate_cpu != nullptr) {
    separate_cpu->apply_config(next);
  }
  if (pinned != nullptr && host_capacity_changes) {
    pinned->replace_backend(make_pinned_host_backend(next.host_capacity_bytes), next);
  } else if (pinned != nullptr) {
    pinned->apply_config(next);
  }
  r.config = std::move(next);
  r.configured = true;
}

Config current_config() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return configured_locked(r);
}

void set_memory_fraction(int device, double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    throw InvalidArgumentError("memory fraction " + detail::shortest_text(fraction) + " for device " + std::to_string(device) +
                               " is outside (0, 1]; pass the share of device memory to allow, e.g. 0.8");
  }
  CachingAllocator& allocator = device_allocator(device);
  Config config = current_config();
  config.memory_fraction = fraction;
  allocator.apply_config(config);
}

BackendKind effective_backend() { return resolve(current_config().backend); }

int default_device() noexcept {
  try {
    return effective_backend() == BackendKind::cuda ? current_cuda_device() : 0;
  } catch (...) {
    return 0;
  }
}

void for_each_device_allocator(const std::function<void(CachingAllocator&)>& fn) {
  for (auto& slot : registry().allocators) {
    if (CachingAllocator* allocator = slot.load(std::memory_order_acquire)) fn(*allocator);
  }
  if (CachingAllocator* cpu = registry().separate_cpu_allocator.load(std::memory_order_acquire)) fn(*cpu);
  if (CachingAllocator* pinned = registry().pinned_host_allocator.load(std::memory_order_acquire)) fn(*pinned);
}

std::vector<CachingAllocator*> device_allocators_made() {
  std::vector<CachingAllocator*> out;
  for (auto& slot : registry().allocators) {
    if (CachingAllocator* allocator = slot.load(std::memory_order_acquire)) out.push_back(allocator);
  }
  return out;
}

CachingAllocator* find_owner(const void* ptr) {
  CachingAllocator* owner = nullptr;
  for_each_device_allocator([&](CachingAllocator& allocator) {
    if (owner == nullptr && allocator.tag_of_block(ptr)) owner = &allocator;
  });
  return owner;
}

void record_stream_anywhere(void* ptr, Stream stream) {
  CachingAllocator* owner = find_owner(ptr);
  if (owner == nullptr) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", ptr);
    throw InvalidPointerError(std::string("record_stream: ") + text +
                              " is not the start of a live block of any remat allocator; pass the pointer the "
                              "allocator returned, before freeing it");
  }
  owner->record_stream(ptr, stream);
}

std::optional<TagId> find_block_tag(const void* ptr) {
  CachingAllocator* owner = find_owner(ptr);
  return owner != nullptr ? owner->tag_of_block(ptr) : std::nullopt;
}

TagId retag_block_anywhere(const void* ptr, TagId tag) {
  std::optional<TagId> previous;
  for_each_device_allocator([&](CachingAllocator& allocator) {
    if (!previous) previous = allocator.retag_block(ptr, tag);
  });
  if (!previous) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", ptr);
    throw InvalidPointerError(std::string("retag: ") + text +
                              " is not the start of a live block of any remat allocator; pass a storage's data "
                              "pointer that the allocator returned (CPU tensors only under tag_cpu_tensors())");
  }
  return *previous;
}

bool retag_category(const void* ptr, Category category, std::string_view module) {
  CachingAllocator* owner = find_owner(ptr);
  if (owner == nullptr) return false;
  const std::optional<TagId> tag = owner->tag_of_block(ptr);
  return tag && owner->retag_block(ptr, with_category(*tag, category, module)).has_value();
}

namespace {

// `tag` as an activation where it has no category or is a temporary, else itself. Remembered per
// thread: a step saves many tensors under few tags.
TagId as_activation(TagId tag) {
  thread_local std::vector<TagId> known;  // by TagId: the answer plus one (0: not asked yet)
  if (tag < known.size() && known[tag] != 0) return known[tag] - 1;
  Tag changed = tag_of(tag);
  TagId answer = tag;
  if (changed.category == Category::none || changed.category == Category::temporary) {
    changed.category = Category::activation;
    answer = intern_tag(changed);
  }
  if (tag >= known.size()) known.resize(static_cast<std::size_t>(tag) + 1);
  known[tag] = answer + 1;
  return answer;
}

}  // namespace

bool categorize_as_activation(const void* ptr) noexcept { return category_in_force() && name_as_activation(ptr); }

bool name_as_activation(const void* ptr) noexcept {
  if (ptr == nullptr) return false;
  try {
    std::optional<TagId> previous;
    TagId now = 0;
    for_each_device_allocator([&](CachingAllocator& allocator) {
      if (!previous && (previous = allocator.retag_block(ptr, &as_activation))) now = as_activation(*previous);
    });
    return previous && now != *previous;
  } catch (...) {
    return false;  // host memory exhausted interning the tag: the block keeps the one it has
  }
}

int add_oom_observer(OomObserver observer) {
  Registry& r = registry();
  auto entry = std::make_shared<ObserverEntry>(std::move(observer));
  std::lock_guard lock(r.observer_mutex);
  const int id = r.next_observer_id++;
  r.observers.emplace(id, std::move(entry));
  return id;
}

// Returns at once; calls already in flight finish on their threads, holding the entry.
bool remove_oom_observer(int id) {
  Registry& r = registry();
  std::shared_ptr<ObserverEntry> entry;  // destroyed after the lock is released
  std::lock_guard lock(r.observer_mutex);
  const auto found = r.observers.find(id);
  if (found == r.observers.end()) return false;
  entry = found->second;
  r.observers.erase(found);
  entry->removed = true;
  return true;
}

}  // namespace remat::alloc
