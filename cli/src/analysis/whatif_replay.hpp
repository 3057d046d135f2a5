#pragma once
// Replays a recorded event stream through the project's own caching pool
// (remat::alloc::CachingAllocator) on the virtual backend, once per configuration, all of them
// side by side in one pass: every event goes to every configuration's pool before the next one
// is read, so a trace on standard input is read once and memory stays bounded by what is live.
//
// Replay rules: `alloc` -> allocate(requested size, stream), remembering recorded address ->
// replayed pointer; `free_requested` then at once `free_completed` -> deallocate; a
// `free_requested` whose `free_completed` comes later -> deallocate with the block held on an
// event that completes at that `free_completed` (as a block used on another stream waits); a
// free of an address the stream never allocated is skipped and counted (a ring that dropped
// older events); every run of consecutive `segment_free` events -> one empty_cache() (the
// recorded allocator gave cached memory back); `oom` is not replayed.
//
// The run under the recorded settings can follow the recording: each segment goes where the
// recorded `segment_alloc` put it (so best fit breaks ties between equal free blocks as the
// recorded allocator did) and each `segment_free` releases that one range. Replayed by the
// allocator that recorded it, such a run is the recording again; where it cannot follow (a
// segment of another size or at a taken range, a release of memory that is not cached), it says
// at which event and goes on as its own replay.
//
// A run whose pool runs out of memory stops at that event and keeps what held memory then.

#include "model/dump.hpp"
#include "reader/trace_file.hpp"

#include <remat/alloc/address_map.hpp>
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

// Where a run that followed the recording could not follow it any more.
struct WhatIfDrift {
  std::uint64_t event = 0;  // counted from 1 over every event of the input
  std::string reason;
};

struct WhatIfRun {
  std::string conf;  // the pool-shaping items of Config::to_string()
  bool followed_recording = false;  // asked to follow, and followed it to the end
  std::optional<WhatIfDrift> drift;   // asked to follow, and stopped following here
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
  std::uint64_t frees = 0;           // frees replayed (at free_completed)
  std::uint64_t held_frees = 0;      // of them, frees that waited on other streams (free_requested earlier)
  std::uint64_t skipped_frees = 0;   // free_completed of addresses allocated before the trace began
  std::uint64_t frees_not_completed = 0;  // blocks freed at the next alloc of their address
  std::uint64_t empty_cache_calls = 0;  // runs of consecutive segment_free events
  std::uint64_t ignored = 0;         // segment_alloc, oom, and free_requested completed at once
  std::uint64_t recorded_ooms = 0;   // oom events: requests the recorded allocator could not meet (not replayed)
};

class WhatIfReplay final : public EventSink {
 public:
  // One run per configuration, in this order, each on a virtual device `device` of `capacity_bytes`.
  // Each pool runs with tagging and the trace ring off and without OOM reports. `tags` names
  // the regions of the holders at a failure; it must outlive the calls to on_event. With
  // `follow_recording`, the first run follows the recording (the input was recorded by this
  // allocator under the first configuration).
  WhatIfReplay(const std::vector<alloc::Config>& configs, std::uint64_t capacity_bytes, int device,
               const TagTable& tags, bool follow_recording = false);
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
    bool held = false;       // freed, waiting for its free to complete: pointers_ hold the events
  };

  void allocate(const Event& event);
  void deallocate(const Event& event);
  // Frees the block at `address` in every running pool (a held one: completes its event);
  // false when none is live there.
  bool release(std::uint64_t address);
  // Frees the block at `address`, held until its free_completed.
  void hold(std::uint64_t address);
  void release_segment(const Event& event);
  void leave_recording(Pool& pool, std::string reason);
  void observe(Pool& pool);
  void fail(Pool& pool, const Event& event, const char* message);
  std::vector<WhatIfHolder> holders() const;

  std::vector<std::unique_ptr<Pool>> pools_;
  const TagTable& tags_;
  alloc::AddressMap<Live> live_;
  std::vector<void*> pointers_;  // pools_.size() replayed pointers (or held events) per live allocation
  std::vector<std::uint32_t> free_slots_;
  WhatIfCounts counts_;
  bool in_segment_free_run_ = false;
  std::optional<std::uint64_t> free_requested_;  // its free_completed may follow at once
  bool started_ = false;
  std::int64_t first_time_ = 0;
};

}  // namespace remat::report
