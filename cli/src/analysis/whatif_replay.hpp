#pragma once
// Replays a recorded event stream through the project's own caching pool
// (remat::alloc::CachingAllocator) on the virtual backend, once per configuration, all of them
// side by side in one pass: every event goes to every configuration's pool before the next one
// is read, so a trace on standard input is read once and memory stays bounded by what is live.
//
// Replay rules: `alloc` -> allocate(size, stream), remembering recorded address -> replayed
// pointer; `free_completed` -> deallocate (a free of an address the stream never allocated is
// skipped and counted: a ring that dropped older events); every run of consecutive
// `segment_free` events -> one empty_cache() (the recorded allocator gave cached memory back);
// `free_requested`, `segment_alloc` and `oom` are not replayed (the pool decides those itself).
// A run whose pool runs out of memory stops at that event and keeps what held memory then.

#include "core/address_map.hpp"
#include "model/dump.hpp"
#include "reader/trace_file.hpp"

#include <remat/alloc/config.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace remat::alloc {
class CachingAllocator;
class VirtualBackend;
}  // namespace remat::alloc

namespace remat::report {

// Memory a region held when a run failed: live recorded bytes and blocks of its allocations.
struct WhatIfHolder {
  std::string region;  // "" for untagged allocations
  std::uint64_t bytes = 0;
  std::uint64_t count = 0;
};

// The first allocation a configuration could not satisfy, and what held memory just before it.
struct WhatIfFailure {
  std::uint64_t event = 0;  // counted from 1 over every event of the input
  std::int64_t time_us = 0;
  std::int64_t since_first_us = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::uint64_t reserved_bytes = 0;   // the pool's reserved bytes before the request
  std::uint64_t allocated_bytes = 0;  // the pool's allocated bytes before the request
  std::vector<WhatIfHolder> holders;  // by region, largest first (empty where the input has no tags)
  std::string message;                // the pool's OutOfMemoryError text, or the replay's limit
  // The replay's own address space ran out (not the replayed device's memory).
  bool replay_limit = false;
};

struct WhatIfRun {
  std::string conf;  // the pool-shaping items of Config::to_string()
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t reserved_at_allocated_peak = 0;  // reserved bytes when allocated first reached its peak
  // The most bytes allocated at any moment reserved stood at its peak.
  std::uint64_t allocated_at_reserved_peak = 0;
  // (peak_reserved - allocated_at_reserved_peak) / peak_reserved: the share of the peak
  // reservation never handed out while it lasted; 0 when nothing was reserved.
  double fragmentation_at_peak = 0;
  std::uint64_t final_reserved = 0;
  std::uint64_t final_allocated = 0;
  std::uint64_t device_allocations = 0;  // the virtual backend's counters
  std::uint64_t device_releases = 0;
  std::uint64_t alloc_retries = 0;  // cache released and the request retried
  std::uint64_t events_replayed = 0;  // events this run took in before it stopped (or all)
  std::optional<WhatIfFailure> failure;
};

// What the input held, counted once for all runs.
struct WhatIfCounts {
  std::uint64_t events = 0;          // every event read
  std::uint64_t allocs = 0;          // alloc events replayed
  std::uint64_t frees = 0;           // free_completed events replayed
  std::uint64_t skipped_frees = 0;   // free_completed of addresses allocated before the trace began
  std::uint64_t frees_not_completed = 0;  // blocks freed at the next alloc of their address
  std::uint64_t empty_cache_calls = 0;  // runs of consecutive segment_free events
  std::uint64_t ignored = 0;         // free_requested, segment_alloc, oom
};

class WhatIfReplay final : public EventSink {
 public:
  // One run per configuration, in this order, each on a virtual device `device` of `capacity_bytes`.
  // Each pool runs with tagging and the trace ring off and without OOM reports. `tags` names
  // the regions of the holders at a failure; it must outlive the calls to on_event.
  WhatIfReplay(const std::vector<alloc::Config>& configs, std::uint64_t capacity_bytes, int device,
               const TagTable& tags);
  ~WhatIfReplay() override;
  WhatIfReplay(const WhatIfReplay&) = delete;
  WhatIfReplay& operator=(const WhatIfReplay&) = delete;

  void on_event(const Event& event) override;

  // The figures of every run, in configuration order, as they stand now.
  std::vector<WhatIfRun> results() const;
  const WhatIfCounts& counts() const { return counts_; }

 private:
  struct Pool;
  struct Live {
    std::uint64_t size = 0;
    std::uint32_t tag = 0;
    std::uint32_t slot = 0;  // row in pointers_
  };

  void allocate(const Event& event);
  void deallocate(const Event& event);
  // Frees the live block at `address` in every running pool; false when none is live there.
  bool release(std::uint64_t address);
  void empty_cache();
  void observe(Pool& pool);
  void fail(Pool& pool, const Event& event, const char* message);
  std::vector<WhatIfHolder> holders() const;

  std::vector<std::unique_ptr<Pool>> pools_;
  const TagTable& tags_;
  AddressMap<Live> live_;
  std::vector<void*> pointers_;        // pools_.size() replayed pointers per live allocation
  std::vector<std::uint32_t> free_slots_;
  WhatIfCounts counts_;
  bool in_segment_free_run_ = false;
  bool started_ = false;
  std::int64_t first_time_ = 0;
};

}  // namespace remat::report
