#include "analysis/whatif_replay.hpp"

#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/virtual_backend.hpp>

#include <algorithm>
#include <iterator>
#include <map>
#include <string_view>

namespace remat::report {

namespace {
// Regions listed as holders at a failure.
constexpr std::size_t kHolders = 5;

// The items of Config::to_string() that shape the pool's decisions; the backend, host
// capacity, trace ring, tagging and OOM-report items change nothing a replay measures.
std::string pool_settings_text(const alloc::Config& config) {
  static constexpr std::string_view kPoolKeys[] = {"max_split_size_mb",         "memory_fraction",
                                                   "roundup_power2_divisions",  "expandable_segments",
                                                   "max_non_split_rounding_mb", "garbage_collection_threshold",
                                                   "large_segment_size_mb"};
  const std::string text = config.to_string();
  std::string kept;
  std::size_t begin = 0;
  int depth = 0;  // inside roundup_power2_divisions' [..] list
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] == '[') ++depth;
    if (i < text.size() && text[i] == ']') --depth;
    if (i < text.size() && (text[i] != ',' || depth > 0)) continue;
    const std::string_view item(text.data() + begin, i - begin);
    const std::string_view key = item.substr(0, item.find(':'));
    if (std::find(std::begin(kPoolKeys), std::end(kPoolKeys), key) != std::end(kPoolKeys)) {
      if (!kept.empty()) kept += ',';
      kept += item;
    }
    begin = i + 1;
  }
  return kept;
}
}  // namespace

struct WhatIfReplay::Pool {
  std::unique_ptr<alloc::CachingAllocator> allocator;
  alloc::VirtualBackend* backend = nullptr;  // owned by allocator
  std::string conf;
  bool stopped = false;
  bool following = false;  // following the recording (see the header)
  std::optional<WhatIfDrift> drift;
  std::uint64_t reserved = 0;  // after the last operation that could change it
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t reserved_at_allocated_peak = 0;
  std::uint64_t allocated_at_reserved_peak = 0;
  std::uint64_t events = 0;
  std::optional<WhatIfFailure> failure;
};

WhatIfReplay::WhatIfReplay(const std::vector<alloc::Config>& configs, std::uint64_t capacity_bytes, int device,
                           const TagTable& tags, bool follow_recording)
    : tags_(tags) {
  for (const alloc::Config& config : configs) {
    auto pool = std::make_unique<Pool>();
    pool->conf = pool_settings_text(config);
    alloc::Config replay = config;
    replay.tagging = false;
    replay.trace_entries = 0;
    auto backend = std::make_unique<alloc::VirtualBackend>(static_cast<std::size_t>(capacity_bytes), device);
    pool->backend = backend.get();
    pool->allocator = std::make_unique<alloc::CachingAllocator>(std::move(backend), replay);
    pool->allocator->set_oom_reporting(false);
    pool->following = follow_recording && pools_.empty();
    pool->backend->follow_recording(pool->following);
    pools_.push_back(std::move(pool));
  }
}

WhatIfReplay::~WhatIfReplay() = default;

void WhatIfReplay::on_event(const Event& event) {
  if (!started_) {
    started_ = true;
    first_time_ = event.time_us;
  }
  ++counts_.events;
  if (free_requested_) {
    // A free that did not complete at once waited for work on other streams.
    const bool completed_at_once = event.action == Action::free_completed && event.address == *free_requested_;
    if (completed_at_once) ++counts_.ignored;
    else hold(*free_requested_);
    free_requested_.reset();
  }
  const bool segment_free = event.action == Action::segment_free;
  switch (event.action) {
    case Action::alloc: allocate(event); break;
    case Action::free_requested: free_requested_ = event.address; break;
    case Action::free_completed: deallocate(event); break;
    case Action::segment_free: release_segment(event); break;
    case Action::segment_alloc:
      for (auto& pool : pools_) {
        if (pool->following && !pool->stopped) pool->backend->expect(event.address, event.size);
      }
      ++counts_.ignored;
      break;
    case Action::oom:
      ++counts_.recorded_ooms;
      ++counts_.ignored;
      break;
    case Action::retag: ++counts_.ignored; break;
  }
  in_segment_free_run_ = segment_free;
  for (auto& pool : pools_) {
    if (!pool->stopped) ++pool->events;
  }
}

void WhatIfReplay::observe(Pool& pool) {
  const alloc::AllocatorStats stats = pool.allocator->stats();
  const auto reserved = static_cast<std::uint64_t>(stats.reserved_bytes.current);
  const auto allocated = static_cast<std::uint64_t>(stats.allocated_bytes.current);
  pool.reserved = reserved;
  if (allocated > pool.peak_allocated) {
    pool.peak_allocated = allocated;
    pool.reserved_at_allocated_peak = reserved;
  }
  if (reserved > pool.peak_reserved) {
    pool.peak_reserved = reserved;
    pool.allocated_at_reserved_peak = allocated;
  } else if (reserved == pool.peak_reserved && allocated > pool.allocated_at_reserved_peak) {
    pool.allocated_at_reserved_peak = allocated;
  }
}

void WhatIfReplay::allocate(const Event& event) {
  ++counts_.allocs;
  // The recorded allocator handed this address out again, so the block there was freed even
  // though its free never completed in the input (a trace cut after free_requested).
  if (release(event.address)) ++counts_.frees_not_completed;
  std::uint32_t slot = 0;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<std::uint32_t>(pointers_.size() / std::max<std::size_t>(pools_.size(), 1));
    pointers_.resize(pointers_.size() + pools_.size(), nullptr);
  }
  void** pointers = pointers_.data() + static_cast<std::size_t>(slot) * pools_.size();
  // The size the caller asked for, rounded by each pool as its settings say; traces that do
  // not record it give the block's.
  const std::uint64_t size = event.requested != 0 ? event.requested : event.size;
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    Pool& pool = *pools_[p];
    pointers[p] = nullptr;
    if (pool.stopped) continue;
    try {
      pointers[p] = pool.allocator->allocate(static_cast<std::size_t>(size), event.stream);
    } catch (const alloc::OutOfMemoryError& error) {
      fail(pool, event, error.what());
      continue;
    }
    if (pool.following && pool.backend->take_misses() > 0) {
      leave_recording(pool, "the pool's new segment was not the one the recording made there");
    }
    observe(pool);
  }
  live_.put(event.address, Live{event.size, event.tag, slot});
}

void WhatIfReplay::deallocate(const Event& event) {
  if (release(event.address)) ++counts_.frees;
  else ++counts_.skipped_frees;
}

bool WhatIfReplay::release(std::uint64_t address) {
  const Live* live = live_.find(address);
  if (live == nullptr) return false;
  const std::uint32_t slot = live->slot;
  void** pointers = pointers_.data() + static_cast<std::size_t>(slot) * pools_.size();
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    Pool& pool = *pools_[p];
    if (pool.stopped) continue;
    // A held block goes back to its pool at the pool's next operation, as the recorded one did.
    if (live->held) pool.backend->complete(pointers[p]);
    else pool.allocator->deallocate(pointers[p]);
  }
  if (live->held) ++counts_.held_frees;
  live_.erase(address);
  free_slots_.push_back(slot);
  return true;
}

void WhatIfReplay::hold(std::uint64_t address) {
  Live* live = live_.find(address);
  if (live == nullptr || live->held) return;
  void** pointers = pointers_.data() + static_cast<std::size_t>(live->slot) * pools_.size();
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    Pool& pool = *pools_[p];
    if (pool.stopped) continue;
    const alloc::Event before = pool.backend->last_held_event();
    pool.allocator->record_stream(pointers[p], alloc::VirtualBackend::kHeldStream);
    pool.allocator->deallocate(pointers[p]);
    // A block allocated on the held stream itself was freed at once: nothing to complete.
    const alloc::Event event = pool.backend->last_held_event();
    pointers[p] = event != before ? event : nullptr;
  }
  live->held = true;
}

void WhatIfReplay::release_segment(const Event& event) {
  const bool starts_run = !in_segment_free_run_;
  if (starts_run) ++counts_.empty_cache_calls;
  for (auto& pool : pools_) {
    if (pool->stopped) continue;
    bool left_now = false;
    if (pool->following && !pool->allocator->release_cached_range(event.address, event.size)) {
      leave_recording(*pool, "the recording released memory the pool did not hold cached there");
      left_now = true;
    }
    // A run not following the recording gives back all its cached memory at the first release.
    if (!pool->following && (starts_run || left_now)) pool->allocator->empty_cache();
    observe(*pool);
  }
}

void WhatIfReplay::leave_recording(Pool& pool, std::string reason) {
  pool.following = false;
  pool.backend->follow_recording(false);
  pool.drift = WhatIfDrift{counts_.events, std::move(reason)};
}

void WhatIfReplay::fail(Pool& pool, const Event& event, const char* message) {
  WhatIfFailure failure;
  failure.event = counts_.events;
  failure.time_us = event.time_us;
  failure.since_first_us = event.time_us - first_time_;
  failure.size = event.requested != 0 ? event.requested : event.size;
  failure.stream = event.stream;
  failure.reserved_bytes = pool.reserved;
  // Releasing cached blocks before giving up leaves allocated bytes as they were.
  failure.allocated_bytes = static_cast<std::uint64_t>(pool.allocator->stats().allocated_bytes.current);
  failure.holders = holders();
  failure.message = message;
  if (pool.backend->address_space_ran_out()) {
    failure.replay_limit = true;
    failure.message = "the replay's 64-bit address space ran out: each stream's expandable segment reserves the "
                      "device's size and an eighth more, and this input has more streams than that space holds "
                      "segments of that size; this is the replay's limit, not the workload's: give --capacity the "
                      "device's real size";
  }
  pool.failure = std::move(failure);
  pool.stopped = true;
  ++pool.events;  // the failing event is the last one this run took in
}

std::vector<WhatIfHolder> WhatIfReplay::holders() const {
  if (tags_.tags.size() <= 1) return {};
  std::map<std::uint32_t, WhatIfHolder> by_region;
  live_.for_each([&](std::uint64_t, const Live& live) {
    const std::uint32_t region = live.tag < tags_.tags.size() ? tags_.tags[live.tag].region : 0;
    WhatIfHolder& holder = by_region[region];
    holder.bytes += live.size;
    ++holder.count;
  });
  std::vector<WhatIfHolder> holders;
  for (auto& [region, holder] : by_region) {
    holder.region = region < tags_.names.size() ? tags_.names[region] : std::string();
    holders.push_back(std::move(holder));
  }
  std::sort(holders.begin(), holders.end(), [](const WhatIfHolder& a, const WhatIfHolder& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.region < b.region;
  });
  if (holders.size() > kHolders) holders.resize(kHolders);
  return holders;
}

std::vector<WhatIfRun> WhatIfReplay::results() const {
  std::vector<WhatIfRun> runs;
  for (const auto& pool : pools_) {
    const alloc::AllocatorStats stats = pool->allocator->stats();
    WhatIfRun run;
    run.conf = pool->conf;
    run.peak_reserved = static_cast<std::uint64_t>(stats.reserved_bytes.peak);
    run.peak_allocated = static_cast<std::uint64_t>(stats.allocated_bytes.peak);
    run.reserved_at_allocated_peak = pool->reserved_at_allocated_peak;
    run.allocated_at_reserved_peak = pool->allocated_at_reserved_peak;
    if (pool->peak_reserved > 0) {
      run.fragmentation_at_peak = static_cast<double>(pool->peak_reserved - pool->allocated_at_reserved_peak) /
                                  static_cast<double>(pool->peak_reserved);
    }
    run.final_reserved = static_cast<std::uint64_t>(stats.reserved_bytes.current);
    run.final_allocated = static_cast<std::uint64_t>(stats.allocated_bytes.current);
    run.device_allocations = pool->backend->device_allocations();
    run.device_releases = pool->backend->device_releases();
    run.alloc_retries = stats.num_alloc_retries;
    run.events_replayed = pool->events;
    run.failure = pool->failure;
    run.followed_recording = pool->following && !pool->failure;
    run.drift = pool->drift;
    runs.push_back(std::move(run));
  }
  return runs;
}

}  // namespace remat::report
