#include "torch_memory_history.hpp"

#include "torch_memory_figures.hpp"

#include <remat/alloc/allocator.hpp>

#include <algorithm>
#include <utility>

namespace remat::detail {
namespace {

using torch_alloc::RecordContext;

constexpr std::uint32_t bit(alloc::TraceAction action) { return 1U << static_cast<unsigned>(action); }

std::uint32_t skipped_actions(const std::vector<std::string>& names) {
  std::uint32_t skipped = 0;
  for (const std::string& name : names) {
    // PyTorch's parser names the action PyTorch does not know; ours has no snapshot, map or unmap
    // events, so skipping those leaves nothing out.
    switch (c10::CachingDeviceAllocator::parseTraceEntryAction(name)) {
      case torch_alloc::TraceEntry::ALLOC: skipped |= bit(alloc::TraceAction::alloc); break;
      case torch_alloc::TraceEntry::FREE_REQUESTED: skipped |= bit(alloc::TraceAction::free_requested); break;
      case torch_alloc::TraceEntry::FREE_COMPLETED: skipped |= bit(alloc::TraceAction::free_completed); break;
      case torch_alloc::TraceEntry::SEGMENT_ALLOC: skipped |= bit(alloc::TraceAction::segment_alloc); break;
      case torch_alloc::TraceEntry::SEGMENT_FREE: skipped |= bit(alloc::TraceAction::segment_free); break;
      case torch_alloc::TraceEntry::OOM: skipped |= bit(alloc::TraceAction::oom); break;
      default: break;
    }
  }
  return skipped;
}

// The most events switching history on grows the ring to (about 48 MiB of host memory per
// device): PyTorch's default max_entries is unlimited. A larger trace_entries set by the user stays.
constexpr std::size_t kHistoryRingEvents = std::size_t{1} << 20;

// The ring must hold what history keeps, up to that; growing it clears it, as switching history
// on does.
void hold_at_least(std::size_t events) {
  const std::size_t wanted = std::min(events, kHistoryRingEvents);
  if (alloc::current_config().trace_entries < wanted) alloc::configure("trace_entries:" + std::to_string(wanted));
}

}  // namespace

void TorchMemoryHistory::configure(bool enabled, torch_alloc::CreateContextFn recorder, std::size_t max_entries,
                                   RecordContext when, bool clear, const std::vector<std::string>& skip_actions) {
  const std::uint32_t skipped = skipped_actions(skip_actions);
  if (enabled) hold_at_least(max_entries);
  std::lock_guard lock(mutex_);
  if (!enabled || clear) start_trace_here();
  if (!enabled) live_.clear();
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : RecordContext::NEVER;
  max_entries_ = enabled ? max_entries : 0;
  skipped_ = enabled ? skipped : 0;
  while (trace_stacks_.size() > max_entries_) trace_stacks_.pop_front();
  gathering_.store(recorder_ != nullptr && when_ != RecordContext::NEVER, std::memory_order_relaxed);
  enabled_.store(enabled, std::memory_order_relaxed);
}

void TorchMemoryHistory::start_trace_here() {
  events_before_.clear();
  for (alloc::CachingAllocator* allocator : alloc::device_allocators_made()) {
    events_before_[allocator->device()] = allocator->trace_events_recorded();
  }
  trace_stacks_.clear();
}

std::size_t TorchMemoryHistory::max_entries() const {
  std::lock_guard lock(mutex_);
  return max_entries_;
}

TorchMemoryHistory::Context TorchMemoryHistory::gather() const {
  torch_alloc::CreateContextFn recorder = nullptr;
  {
    std::lock_guard lock(mutex_);
    recorder = recorder_;
  }
  // The recorder takes Python's lock to read the stack: never call it under ours.
  return recorder == nullptr ? nullptr : recorder();
}

void TorchMemoryHistory::remember(const void* ptr, bool at_free, Context context) {
  const auto address = reinterpret_cast<std::uint64_t>(ptr);
  std::lock_guard lock(mutex_);
  if (!at_free) live_[address] = context;
  const bool in_trace = at_free ? when_ == RecordContext::ALL : when_ >= RecordContext::ALLOC;
  if (!in_trace || max_entries_ == 0) return;
  trace_stacks_.push_back({address, at_free, std::move(context)});
  if (trace_stacks_.size() > max_entries_) trace_stacks_.pop_front();
}

void TorchMemoryHistory::allocated(const void* ptr) {
  if (ptr == nullptr || !gathering_.load(std::memory_order_relaxed)) return;
  if (Context context = gather()) remember(ptr, false, std::move(context));
}

void TorchMemoryHistory::freed(const void* ptr) {
  if (ptr == nullptr || !gathering_.load(std::memory_order_relaxed)) return;
  {
    std::lock_guard lock(mutex_);
    live_.erase(reinterpret_cast<std::uint64_t>(ptr));
    if (when_ != RecordContext::ALL) return;
  }
  if (Context context = gather()) remember(ptr, true, std::move(context));
}

TorchMemoryHistory::Context TorchMemoryHistory::block_context(std::uint64_t address) const {
  std::lock_guard lock(mutex_);
  const auto it = live_.find(address);
  return it == live_.end() ? nullptr : it->second;
}

std::vector<torch_alloc::TraceEntry> TorchMemoryHistory::entries(
    const alloc::AllocatorSnapshot& device, const std::function<std::string(alloc::TagId)>& user_metadata) const {
  std::lock_guard lock(mutex_);
  const auto before = events_before_.find(device.device);
  const std::uint64_t since_clear =
      device.trace_events_recorded - (before == events_before_.end() ? 0 : before->second);
  const std::size_t first = device.trace.size() - std::min<std::uint64_t>(since_clear, device.trace.size());
  std::vector<const alloc::TraceEvent*> kept;
  for (std::size_t i = first; i < device.trace.size(); ++i) {
    // A retag has no PyTorch action: an entry's user_metadata keeps the tag it was allocated with.
    if (device.trace[i].action == alloc::TraceAction::retag) continue;
    if ((skipped_ & bit(device.trace[i].action)) == 0) kept.push_back(&device.trace[i]);
  }
  if (max_entries_ != 0 && kept.size() > max_entries_) {
    kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(max_entries_));
  }

  // Stacks by (address, at free), oldest first; the newest events take the newest stacks.
  std::map<std::pair<std::uint64_t, bool>, std::vector<const Context*>> stacks;
  for (const Gathered& gathered : trace_stacks_)
    stacks[{gathered.address, gathered.at_free}].push_back(&gathered.context);
  std::vector<Context> contexts(kept.size());
  for (std::size_t i = kept.size(); i-- > 0;) {
    const alloc::TraceEvent& event = *kept[i];
    if (event.action != alloc::TraceAction::alloc && event.action != alloc::TraceAction::free_requested) continue;
    const auto it = stacks.find({event.address, event.action == alloc::TraceAction::free_requested});
    if (it == stacks.end() || it->second.empty()) continue;
    contexts[i] = *it->second.back();
    it->second.pop_back();
  }

  std::vector<torch_alloc::TraceEntry> out;
  out.reserve(kept.size());
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const alloc::TraceEvent& event = *kept[i];
    out.emplace_back(to_trace_action(event.action), static_cast<c10::DeviceIndex>(device.device),
                     static_cast<std::size_t>(event.address), static_cast<std::size_t>(event.size),
                     reinterpret_cast<void*>(static_cast<std::uintptr_t>(event.stream)), c10::MempoolId_t{0, 0}, 0,
                     std::move(contexts[i]), "", user_metadata(event.tag));
    out.back().time_.t_ = static_cast<std::time_t>(event.time_us);
  }
  return out;
}

}  // namespace remat::detail
