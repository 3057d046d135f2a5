#pragma once
// PyTorch's memory history (torch.cuda.memory._record_memory_history) over the tagging
// allocator's trace ring. The ring records every event whether history is on or not, so a
// snapshot's device_traces always hold it: the events since the allocator was installed or
// history was last cleared or switched off (PyTorch empties its buffer then), without the
// skipped actions, the last max_entries while history is on. History on adds the Python stacks PyTorch's context
// recorder gathers, on the allocating thread as the allocation returns, kept by address: for
// live blocks (every mode but NEVER), for the trace's alloc entries (ALLOC and ALL) and its
// free_requested entries (ALL). A snapshot matches the trace's events to those stacks address
// by address, newest first.

#include <remat/alloc/allocator_snapshot.hpp>

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace remat::detail {

namespace torch_alloc = c10::cuda::CUDACachingAllocator;

class TorchMemoryHistory {
 public:
  using Context = std::shared_ptr<c10::GatheredContext>;

  // The trace starts empty: what the rings recorded before is not history.
  TorchMemoryHistory() { start_trace_here(); }

  // PyTorch's recordHistory arguments. Throws remat::Error naming an unknown skip action.
  void configure(bool enabled, torch_alloc::CreateContextFn recorder, std::size_t max_entries,
                 torch_alloc::RecordContext when, bool clear, const std::vector<std::string>& skip_actions);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // What history keeps at most while it is on (0 when off).
  std::size_t max_entries() const;

  // The allocation path's calls; each costs one relaxed load while no stacks are recorded.
  void allocated(const void* ptr);
  void freed(const void* ptr);

  // The stack of the live block at `address`, if one was gathered.
  Context block_context(std::uint64_t address) const;
  // The trace in one device's snapshot as PyTorch's trace entries; `user_metadata` names an
  // event's tag.
  std::vector<torch_alloc::TraceEntry> entries(const alloc::AllocatorSnapshot& device,
                                               const std::function<std::string(alloc::TagId)>& user_metadata) const;

 private:
  struct Gathered {
    std::uint64_t address = 0;
    bool at_free = false;
    Context context;
  };
  Context gather() const;
  void start_trace_here();  // under mutex_, or before anyone else can reach it
  void remember(const void* ptr, bool at_free, Context context);

  std::atomic<bool> enabled_{false};
  std::atomic<bool> gathering_{false};  // stacks are gathered (a recorder and a mode past NEVER)
  mutable std::mutex mutex_;
  torch_alloc::CreateContextFn recorder_ = nullptr;
  torch_alloc::RecordContext when_ = torch_alloc::RecordContext::NEVER;
  std::size_t max_entries_ = 0;
  // Events each device's ring had recorded when history was last cleared: those are not in it.
  std::map<int, std::uint64_t> events_before_;
  std::uint32_t skipped_ = 0;                        // bit per alloc::TraceAction
  std::unordered_map<std::uint64_t, Context> live_;  // block address -> stack at allocation
  std::deque<Gathered> trace_stacks_;                // newest last, at most max_entries_
};

}  // namespace remat::detail
