#include <remat/alloc/bytes.hpp>
#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/errors.hpp>

#include "detail/adaptive_mutex.hpp"
#include "detail/block.hpp"
#include "detail/format.hpp"
#include "detail/free_pools.hpp"
#include "detail/oom_reporting.hpp"
#include "detail/pointer_map.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <utility>

namespace remat::alloc {

using detail::format_address;

std::size_t round_request_size(std::size_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

namespace {

std::size_t floor_log2(std::size_t value) { return static_cast<std::size_t>(63 - __builtin_clzll(value)); }

// The next of `divisions` equal steps between the powers of two around `size` (PyTorch's
// roundup_power2_next_division): 1.2 MiB in 4 divisions is 1.25 MiB.
std::size_t next_power2_division(std::size_t size, std::size_t divisions) {
  if ((size & (size - 1)) == 0) return size;
  const std::size_t floor = std::size_t{1} << floor_log2(size);
  const std::size_t step = floor >> floor_log2(divisions);
  if (step == 0) return floor << 1;
  const std::size_t below = size & ~(step - 1);
  return below == size ? size : below + step;
}

}  // namespace

std::size_t round_request_size(std::size_t size, const std::size_t* roundup_power2_divisions) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::size_t log_size = floor_log2(size);
  const std::size_t index =
      std::min<std::size_t>(log_size > 20 ? log_size - 20 : 0, Config::kRoundUpIntervals - 1);
  const std::size_t divisions = roundup_power2_divisions[index];
  if (divisions > 1 && size > kMinBlockSize * divisions) return next_power2_division(size, divisions);
  return round_request_size(size);
}

std::size_t segment_size_for(std::size_t rounded_size, std::size_t large_segment_size) {
  if (rounded_size <= kSmallRequestLimit) return kSmallSegmentSize;
  if (rounded_size < kMinLargeAlloc) return large_segment_size;
  return (rounded_size + kLargeRoundUp - 1) / kLargeRoundUp * kLargeRoundUp;
}

std::string_view to_string(BlockState state) {
  switch (state) {
    case BlockState::active_allocated: return "active_allocated";
    case BlockState::active_pending_free: return "active_pending_free";
    case BlockState::inactive: break;
  }
  return "inactive";
}

namespace {

using detail::Block;
using detail::ExpandableSegment;

std::size_t reserved_cap(Backend& backend, const Config& config) {
  if (config.memory_fraction >= 1.0) return Config::kUnlimited;
  return static_cast<std::size_t>(config.memory_fraction * static_cast<double>(backend.memory_info().total_bytes));
}

std::size_t round_up(std::size_t value, std::size_t step) { return (value + step - 1) / step * step; }

void check_backend_supports(const Backend& backend, const Config& config) {
  if (config.expandable_segments && backend.granularity() == 0) {
    throw ConfigError("expandable_segments:True needs a backend that maps memory into reserved address space; "
                      "the " + std::string(backend.name()) + " backend cannot: set expandable_segments:False");
  }
}

}  // namespace

struct CachingAllocator::State {
  State(std::unique_ptr<Backend> b, const Config& c)
      : backend(std::move(b)), config(c), reserved_limit(reserved_cap(*backend, c)), trace(c.trace_entries) {
    check_backend_supports(*backend, config);
  }

  mutable detail::AdaptiveMutex mutex;
  std::unique_ptr<Backend> backend;
  Config config;
  std::size_t reserved_limit;
  detail::SmallPool small_pool;
  detail::LargePool large_pool;
  detail::PointerMap<Block> live;
  std::map<std::uintptr_t, Block*> segments;  // head block of each segment by address
  std::vector<std::pair<Event, Block*>> pending_frees;
  std::vector<Block*> spare_blocks;
  std::vector<std::unique_ptr<ExpandableSegment>> expandable;  // one per stream and pool in use
  std::uint64_t frees = 0;                                      // stamps Block::freed_at
  AllocatorStats stats;
  std::vector<TagStats> tag_stats;  // indexed by TagId
  TraceRing trace;
  OomHandler oom_handler;
  bool oom_reporting = true;
  detail::OomDumpLimiter oom_dumps;

  void insert_free(Block* block) {
    if (block->small) small_pool.insert(block);
    else large_pool.insert(block);
  }
  void erase_free(Block* block) {
    if (block->small) small_pool.erase(block);
    else large_pool.erase(block);
  }
  Block* take_free_block(bool small, Stream stream, std::size_t size) {
    return small ? small_pool.take_best_fit(stream, size)
                 : large_pool.take_best_fit(stream, size, config.max_split_size_bytes,
                                            config.max_non_split_rounding_bytes);
  }

  Block* new_block() {
    if (spare_blocks.empty()) return new Block();
    Block* block = spare_blocks.back();
    spare_blocks.pop_back();
    *block = Block();
    return block;
  }
  void recycle(Block* block) {
    block->stream_uses = {};
    spare_blocks.push_back(block);
  }

  TagStats& stats_for(TagId tag) {
    if (tag >= tag_stats.size()) tag_stats.resize(static_cast<std::size_t>(tag) + 1);
    return tag_stats[tag];
  }

  std::vector<TagStatsEntry> tags_that_allocated() const {
    std::vector<TagStatsEntry> out;
    for (std::size_t tag = 0; tag < tag_stats.size(); ++tag) {
      if (tag_stats[tag].count.total_added != 0) out.push_back({static_cast<TagId>(tag), tag_stats[tag]});
    }
    return out;
  }

  Block* new_segment(std::size_t size, Stream stream, bool small) {
    if (detail::exceeds_reserved_cap(static_cast<std::size_t>(stats.reserved_bytes.current), reserved_limit, size)) {
      return nullptr;
    }
    void* ptr = backend->allocate(size);
    if (ptr == nullptr) return nullptr;
    Block* block = new_block();
    block->address = reinterpret_cast<std::uintptr_t>(ptr);
    block->size = size;
    block->stream = stream;
    block->small = small;
    segments.emplace(block->address, block);
    stats.reserved_bytes.add(static_cast<std::int64_t>(size));
    stats.segments.add(1);
    trace.record(TraceAction::segment_alloc, block->address, size, stream, current_tag_id());
    return block;
  }

  void release_segment(Block* block) {
    backend->deallocate(reinterpret_cast<void*>(block->address), block->size);
    segments.erase(block->address);
    stats.reserved_bytes.subtract(static_cast<std::int64_t>(block->size));
    stats.segments.subtract(1);
    trace.record(TraceAction::segment_free, block->address, block->size, block->stream, 0);
    recycle(block);
  }

  // A block for `rounded` bytes from new device memory: a new fixed segment, or the stream's
  // expandable segment grown at its end.
  Block* new_memory(std::size_t rounded, Stream stream, bool small) {
    if (config.expandable_segments) return grow_expandable(rounded, stream, small);
    return new_segment(segment_size_for(rounded, config.large_segment_size_bytes), stream, small);
  }

  ExpandableSegment* expandable_for(Stream stream, bool small) {
    for (const auto& segment : expandable) {
      if (segment->stream == stream && segment->small == small) return segment.get();
    }
    // As PyTorch: room to map the whole device and an eighth more, in whole growth steps.
    const std::size_t step = growth_step(small);
    const std::size_t total = backend->memory_info().total_bytes;
    constexpr std::size_t kLargest = std::numeric_limits<std::size_t>::max();
    const bool fits = total <= kLargest - step && total / 8 < kLargest - step - total;
    const std::size_t reserved = fits ? round_up(total + total / 8, step) : kLargest / step * step;
    void* base = backend->reserve(reserved);
    if (base == nullptr) return nullptr;
    auto segment = std::make_unique<ExpandableSegment>();
    segment->base = reinterpret_cast<std::uintptr_t>(base);
    segment->reserved = reserved;
    segment->stream = stream;
    segment->small = small;
    return expandable.emplace_back(std::move(segment)).get();
  }

  // One small or large segment, in whole granules of the backend.
  std::size_t growth_step(bool small) const {
    return std::lcm(small ? kSmallSegmentSize : config.large_segment_size_bytes, backend->granularity());
  }

  // Maps enough at the segment's end for `rounded` bytes in its free tail block (or a new
  // tail block) and returns that block, out of the free pool; nullptr when the cap, the
  // reservation or the device has no room.
  Block* grow_expandable(std::size_t rounded, Stream stream, bool small) {
    ExpandableSegment* segment = expandable_for(stream, small);
    if (segment == nullptr) return nullptr;
    Block* tail = segment->tail;
    // A free tail too small for the request grows; one the pool would not hand out
    // (max_split_size) stays as it is, with the new block after it.
    const bool extend_tail = tail != nullptr && tail->is_free() && tail->size < rounded;
    const std::size_t have = extend_tail ? tail->size : 0;
    const std::size_t grow = round_up(rounded - have, growth_step(small));
    if (grow > segment->reserved - segment->mapped ||
        detail::exceeds_reserved_cap(static_cast<std::size_t>(stats.reserved_bytes.current), reserved_limit, grow)) {
      return nullptr;
    }
    const std::uintptr_t end = segment->base + segment->mapped;
    if (!backend->map(reinterpret_cast<void*>(end), grow)) return nullptr;
    if (segment->mapped == 0) stats.segments.add(1);
    segment->mapped += grow;
    stats.reserved_bytes.add(static_cast<std::int64_t>(grow));
    trace.record(TraceAction::segment_alloc, end, grow, stream, current_tag_id());
    if (extend_tail) {
      erase_free(tail);
      tail->size += grow;
      return tail;
    }
    Block* block = new_block();
    block->address = end;
    block->size = grow;
    block->stream = stream;
    block->small = small;
    block->expandable = segment;
    block->prev = tail;
    if (tail != nullptr) tail->next = block;
    else segments.emplace(block->address, block);
    segment->tail = block;
    return block;
  }

  // Unmaps the whole granules of the segment's free tail block; the segment's reservation
  // goes back once nothing of it is mapped. Returns the bytes unmapped.
  std::size_t shrink_expandable(ExpandableSegment& segment) {
    Block* tail = segment.tail;
    if (tail == nullptr || !tail->is_free()) return 0;
    const std::uintptr_t end = segment.base + segment.mapped;
    const std::uintptr_t keep_to = segment.base + round_up(tail->address - segment.base, backend->granularity());
    if (keep_to >= end) return 0;
    const std::size_t unmapped = end - keep_to;
    erase_free(tail);
    backend->unmap(reinterpret_cast<void*>(keep_to), unmapped);
    trace.record(TraceAction::segment_free, keep_to, unmapped, segment.stream, 0);
    segment.mapped -= unmapped;
    stats.reserved_bytes.subtract(static_cast<std::int64_t>(unmapped));
    if (keep_to > tail->address) {
      tail->size = keep_to - tail->address;
      insert_free(tail);
      return unmapped;
    }
    segment.tail = tail->prev;
    if (tail->prev != nullptr) tail->prev->next = nullptr;
    else segments.erase(tail->address);
    recycle(tail);
    if (segment.mapped == 0) {
      stats.segments.subtract(1);
      backend->release(reinterpret_cast<void*>(segment.base), segment.reserved);
      std::erase_if(expandable, [&](const auto& owned) { return owned.get() == &segment; });
    }
    return unmapped;
  }

  void release_cached_blocks() {
    std::vector<Block*> whole;
    small_pool.for_each([&](Block* block) { if (block->is_whole_segment()) whole.push_back(block); });
    large_pool.for_each([&](Block* block) { if (block->is_whole_segment()) whole.push_back(block); });
    for (Block* block : whole) {
      erase_free(block);
      release_segment(block);
    }
    std::vector<ExpandableSegment*> grown;
    for (const auto& segment : expandable) grown.push_back(segment.get());
    for (ExpandableSegment* segment : grown) shrink_expandable(*segment);
  }

  // PyTorch's garbage_collection_threshold: with a memory_fraction cap, once reserved bytes
  // pass the threshold's share of it, give back the cached memory idle longest (whole free
  // segments, expandable segments' free tails) until reserved is under the threshold again.
  void collect_garbage() {
    if (config.garbage_collection_threshold <= 0.0 || reserved_limit == Config::kUnlimited) return;
    const auto threshold = static_cast<std::size_t>(config.garbage_collection_threshold *
                                                    static_cast<double>(reserved_limit));
    auto reserved = [&] { return static_cast<std::size_t>(stats.reserved_bytes.current); };
    if (reserved() <= threshold) return;
    std::vector<Block*> idle;
    auto consider = [&](Block* block) {
      if (block->is_whole_segment() || (block->expandable != nullptr && block == block->expandable->tail)) {
        idle.push_back(block);
      }
    };
    small_pool.for_each(consider);
    large_pool.for_each(consider);
    std::sort(idle.begin(), idle.end(), [](const Block* a, const Block* b) { return a->freed_at < b->freed_at; });
    for (Block* block : idle) {
      if (reserved() <= threshold) break;
      if (block->expandable != nullptr) {
        shrink_expandable(*block->expandable);
      } else {
        erase_free(block);
        release_segment(block);
      }
    }
  }

  void split(Block* block, std::size_t size) {
    const std::size_t remaining = block->size - size;
    // As PyTorch: expandable segments split any remainder, like the small pool.
    const bool worth_splitting = block->small || block->expandable != nullptr
                                     ? remaining >= kMinBlockSize
                                     : size < config.max_split_size_bytes && remaining > kSmallRequestLimit;
    if (!worth_splitting) return;
    Block* rest = new_block();
    rest->address = block->address + size;
    rest->size = remaining;
    rest->stream = block->stream;
    rest->small = block->small;
    rest->expandable = block->expandable;
    rest->freed_at = ++frees;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    else if (rest->expandable != nullptr) rest->expandable->tail = rest;
    block->next = rest;
    block->size = size;
    insert_free(rest);
  }

  // Absorbs `neighbour` into `block` when it is free; keeps segment bookkeeping right.
  void merge(Block* block, Block* neighbour) {
    if (neighbour == nullptr || !neighbour->is_free()) return;
    erase_free(neighbour);
    if (neighbour == block->prev) {
      block->address = neighbour->address;
      block->prev = neighbour->prev;
      if (block->prev != nullptr) block->prev->next = block;
      else segments[block->address] = block;
    } else {
      block->next = neighbour->next;
      if (block->next != nullptr) block->next->prev = block;
      else if (block->expandable != nullptr) block->expandable->tail = block;
    }
    block->size += neighbour->size;
    recycle(neighbour);
  }

  // The block is no longer used by anyone: return it to its pool.
  void complete_free(Block* block) {
    stats.active_bytes.subtract(static_cast<std::int64_t>(block->size));
    block->requested = 0;
    block->tag = 0;
    merge(block, block->prev);
    merge(block, block->next);
    block->freed_at = ++frees;
    insert_free(block);
  }

  // Retires completed stream events; with `wait`, blocks on each where the backend can.
  void process_pending_frees(bool wait) {
    for (std::size_t i = 0; i < pending_frees.size();) {
      auto [event, block] = pending_frees[i];
      const bool done = wait ? backend->wait_event(event) : backend->event_completed(event);
      if (!done) {
        ++i;
        continue;
      }
      backend->destroy_event(event);
      pending_frees[i] = pending_frees.back();
      pending_frees.pop_back();
      if (--block->pending_events == 0) {
        trace.record(TraceAction::free_completed, block->address, block->size, block->stream, block->tag);
        complete_free(block);
      }
    }
  }

  // What the OOM report needs from the pool's own books; the rest comes from the per-tag
  // statistics and the trace (detail/oom_reporting.hpp).
  detail::PoolFigures figures_for_oom_report() const {
    detail::FreeSpace free;
    auto count = [&free](const Block* block) {
      const auto bytes = static_cast<std::int64_t>(block->size);
      free.largest_free_block = std::max(free.largest_free_block, bytes);
      if (block->is_whole_segment() || (block->expandable != nullptr && block == block->expandable->tail)) {
        free.releasable_bytes += bytes;
      } else {
        free.fragmented_free_bytes += bytes;
        ++free.free_blocks_in_split_segments;
      }
    };
    small_pool.for_each(count);
    large_pool.for_each(count);
    return {backend->device(), backend->name(), backend->memory_info(), config, reserved_limit,
            stats, tag_stats, trace, free};
  }

  std::string describe_bad_pointer(std::uintptr_t address) const {
    const std::string where = format_address(address);
    auto it = segments.upper_bound(address);
    if (it != segments.begin()) {
      --it;
      for (const Block* block = it->second; block != nullptr; block = block->next) {
        if (address < block->address || address >= block->address + block->size) continue;
        if (!block->allocated && address == block->address) {
          return "free of " + where + ", which is already free (double free); free each pointer exactly once";
        }
        if (!block->allocated) {
          return "free of " + where + ", which lies inside free cached memory: a pointer past the start of its "
                 "block, or a double free of a block since merged with its free neighbours; free the pointer that "
                 "allocation returned, once";
        }
        return "free of " + where + ", which points inside the live block at " + format_address(block->address) +
               "; free the pointer that allocation returned";
      }
    }
    return "free of " + where + ", which this allocator (device " + std::to_string(backend->device()) +
           ") never returned; free it with the allocator that allocated it";
  }
};

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, const Config& config)
    : state_(std::make_unique<State>(std::move(backend), config)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(state_->mutex);
  state_->process_pending_frees(true);
  state_->release_cached_blocks();
  // Segments that still hold live blocks (a pool dropped mid-run, as `whatif` drops a run that
  // failed): their memory goes with the backend, their block records with the pool.
  for (const auto& [address, head] : state_->segments) {
    for (Block* block = head; block != nullptr;) delete std::exchange(block, block->next);
  }
  for (Block* block : state_->spare_blocks) delete block;
}

void CachingAllocator::report_out_of_memory(std::unique_lock<detail::AdaptiveMutex>& lock, std::size_t size,
                                            std::size_t rounded, std::size_t segment_size, TagId tag) {
  State& s = *state_;
  if (!s.oom_reporting) {
    lock.unlock();
    throw OutOfMemoryError("out of memory on device " + std::to_string(s.backend->device()) + ": tried to allocate " +
                           format_bytes(size));
  }
  OomEvent event;
  event.device = s.backend->device();
  event.requested_bytes = size;
  event.rounded_bytes = rounded;
  event.reserved_bytes = s.stats.reserved_bytes.current;
  event.allocated_bytes = s.stats.allocated_bytes.current;
  event.tag = tag;
  bool may_dump = false;
  try {
    auto report = std::make_shared<OomReport>(build_oom_report(s.figures_for_oom_report(), size, rounded, segment_size));
    event.memory = report->memory;
    event.message = oom_message(*report);
    event.report = std::move(report);
    may_dump = s.oom_dumps.take(s.config.oom_dump_interval_ms);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat: could not build the out-of-memory report: %s\n", e.what());
    event.message = "out of memory on device " + std::to_string(event.device) + ": tried to allocate " +
                    format_bytes(size) + "; free tensors, recompute more regions, or lower the batch size";
  }
  std::string directory = s.config.oom_dump_dir;
  const OomHandler handler = s.oom_handler;
  lock.unlock();
  // Nothing holds the pool's lock from here on: the dump, the stderr line and the handler
  // may allocate, block or re-enter the allocator.
  detail::announce_out_of_memory(event, std::move(directory), may_dump, handler);
  throw OutOfMemoryError(event.message);
}

void* CachingAllocator::allocate(std::size_t size, Stream stream) {
  if (size == 0) return nullptr;
  if (size > kMaxRequestSize) {
    std::lock_guard lock(state_->mutex);
    ++state_->stats.num_ooms;
    throw OutOfMemoryError("request of " + std::to_string(size) + " bytes (" + format_bytes(size) +
                           ") exceeds what any device holds (limit " + format_bytes(kMaxRequestSize) +
                           "); check the size computation that produced it");
  }
  State& s = *state_;
  std::unique_lock<detail::AdaptiveMutex> lock(s.mutex);
  const TagId tag = s.config.tagging ? current_tag_id() : 0;
  if (!s.pending_frees.empty()) s.process_pending_frees(false);

  const std::size_t rounded = round_request_size(size, s.config.roundup_power2_divisions.data());
  const bool small = rounded <= kSmallRequestLimit;
  Block* block = s.take_free_block(small, stream, rounded);
  if (block == nullptr) {
    s.collect_garbage();
    block = s.new_memory(rounded, stream, small);
    if (block == nullptr) {
      // Like PyTorch: wait for freed blocks still in use by streams, give every cached
      // segment back, and try once more before declaring out-of-memory.
      ++s.stats.num_alloc_retries;
      s.process_pending_frees(true);
      s.release_cached_blocks();
      block = s.take_free_block(small, stream, rounded);
      if (block == nullptr) block = s.new_memory(rounded, stream, small);
    }
    if (block == nullptr) {
      ++s.stats.num_ooms;
      s.trace.record(TraceAction::oom, 0, rounded, stream, tag);
      const std::size_t segment_size = s.config.expandable_segments
                                           ? round_up(rounded, s.growth_step(small))
                                           : segment_size_for(rounded, s.config.large_segment_size_bytes);
      report_out_of_memory(lock, size, rounded, segment_size, tag);
    }
  }
  s.split(block, rounded);
  block->allocated = true;
  block->requested = size;
  block->tag = tag;
  s.live.insert(block->address, block);

  const auto bytes = static_cast<std::int64_t>(block->size);
  s.stats.allocated_bytes.add(bytes);
  s.stats.active_bytes.add(bytes);
  s.stats.requested_bytes.add(static_cast<std::int64_t>(size));
  s.stats.allocations.add(1);
  TagStats& per_tag = s.stats_for(tag);
  per_tag.bytes.add(bytes);
  per_tag.requested_bytes.add(static_cast<std::int64_t>(size));
  per_tag.count.add(1);
  s.trace.record(TraceAction::alloc, block->address, block->size, stream, tag);
  return reinterpret_cast<void*>(block->address);
}

void CachingAllocator::deallocate(void* ptr, std::size_t expected_size) {
  if (ptr == nullptr) return;
  State& s = *state_;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(s.mutex);
  Block* block = s.live.find(address);
  if (block == nullptr) {
    ++s.stats.num_invalid_frees;
    throw InvalidPointerError(s.describe_bad_pointer(address));
  }
  if (expected_size != 0 && expected_size != block->requested) {
    ++s.stats.num_invalid_frees;
    throw InvalidPointerError("free of " + format_address(address) + " with size " + std::to_string(expected_size) +
                              ", but it was allocated with size " + std::to_string(block->requested) +
                              "; pass the size given at allocation (the block stays allocated)");
  }
  s.live.erase(address);
  block->allocated = false;

  const auto bytes = static_cast<std::int64_t>(block->size);
  const auto requested = static_cast<std::int64_t>(block->requested);
  s.stats.allocated_bytes.subtract(bytes);
  s.stats.requested_bytes.subtract(requested);
  s.stats.allocations.subtract(1);
  TagStats& per_tag = s.tag_stats[block->tag];
  per_tag.bytes.subtract(bytes);
  per_tag.requested_bytes.subtract(requested);
  per_tag.count.subtract(1);
  if (block->stream_uses.empty()) {
    s.trace.record_immediate_free(address, block->size, block->stream, block->tag);
    s.complete_free(block);
    return;
  }
  s.trace.record(TraceAction::free_requested, address, block->size, block->stream, block->tag);
  for (const Stream used_on : block->stream_uses) {
    s.pending_frees.emplace_back(s.backend->record_event(used_on), block);
    ++block->pending_events;
  }
  block->stream_uses.clear();
}

void CachingAllocator::record_stream(void* ptr, Stream stream) {
  State& s = *state_;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(s.mutex);
  Block* block = s.live.find(address);
  if (block == nullptr) {
    throw InvalidPointerError("record_stream on " + format_address(address) +
                              ", which is not a live allocation of this allocator; pass a pointer it returned "
                              "and has not freed");
  }
  if (stream == block->stream) return;
  for (const Stream used_on : block->stream_uses) {
    if (used_on == stream) return;
  }
  block->stream_uses.push_back(stream);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(state_->mutex);
  state_->process_pending_frees(false);
  state_->release_cached_blocks();
}

void CachingAllocator::apply_config(const Config& config) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  check_backend_supports(*s.backend, config);
  if (config.trace_entries != s.config.trace_entries) s.trace.resize(config.trace_entries);
  s.reserved_limit = reserved_cap(*s.backend, config);
  s.config = config;
}

void CachingAllocator::replace_backend(std::unique_ptr<Backend> backend, const Config& config) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (s.live.size() != 0 || !s.pending_frees.empty()) {
    throw StateError("cannot switch the backend of device " + std::to_string(s.backend->device()) + " while " +
                     std::to_string(s.live.size()) + " blocks are live; configure the backend before the first "
                     "allocation or free everything first");
  }
  check_backend_supports(*backend, config);
  s.release_cached_blocks();
  s.backend = std::move(backend);
  if (config.trace_entries != s.config.trace_entries) s.trace.resize(config.trace_entries);
  s.reserved_limit = reserved_cap(*s.backend, config);
  s.config = config;
}

void CachingAllocator::set_oom_handler(OomHandler handler) {
  std::lock_guard lock(state_->mutex);
  state_->oom_handler = std::move(handler);
}

void CachingAllocator::set_oom_reporting(bool enabled) {
  std::lock_guard lock(state_->mutex);
  state_->oom_reporting = enabled;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

void CachingAllocator::reset_peak_stats() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  for (Stat* stat : {&s.stats.allocated_bytes, &s.stats.requested_bytes, &s.stats.active_bytes,
                     &s.stats.reserved_bytes, &s.stats.allocations, &s.stats.segments}) {
    stat->reset_peak();
  }
  for (TagStats& per_tag : s.tag_stats) {
    per_tag.bytes.reset_peak();
    per_tag.requested_bytes.reset_peak();
    per_tag.count.reset_peak();
  }
}

AllocatorSnapshot CachingAllocator::snapshot() const {
  const State& s = *state_;
  std::lock_guard lock(s.mutex);
  AllocatorSnapshot out;
  out.device = s.backend->device();
  out.backend = std::string(s.backend->name());
  out.config = s.config;
  out.stats = s.stats;
  out.memory = s.backend->memory_info();
  out.tag_stats = s.tags_that_allocated();
  out.segments.reserve(s.segments.size());
  for (const auto& [address, head] : s.segments) {
    SegmentInfo segment;
    segment.address = address;
    segment.stream = head->stream;
    segment.is_small = head->small;
    segment.is_expandable = head->expandable != nullptr;
    for (const Block* block = head; block != nullptr; block = block->next) {
      const BlockState state = block->allocated ? BlockState::active_allocated
                               : block->pending_events > 0 ? BlockState::active_pending_free
                                                            : BlockState::inactive;
      segment.blocks.push_back({block->address, block->size, block->requested, state, block->tag});
      segment.total_size += block->size;
    }
    out.segments.push_back(std::move(segment));
  }
  out.trace = s.trace.events();
  out.trace_capacity = s.trace.capacity();
  out.trace_dropped = s.trace.dropped();
  return out;
}

void CachingAllocator::hold_for_fork() { state_->mutex.lock(); }
void CachingAllocator::release_after_fork() { state_->mutex.unlock(); }

std::vector<TagStatsEntry> CachingAllocator::tag_stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->tags_that_allocated();
}

std::optional<TagId> CachingAllocator::tag_of_block(const void* ptr) const {
  std::lock_guard lock(state_->mutex);
  const Block* block = state_->live.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return std::nullopt;
  return block->tag;
}

std::int64_t CachingAllocator::live_requested_bytes(std::string_view region_prefix) const {
  std::vector<std::pair<TagId, std::int64_t>> live_by_tag;
  {
    std::lock_guard lock(state_->mutex);
    for (std::size_t tag = 0; tag < state_->tag_stats.size(); ++tag) {
      const std::int64_t bytes = state_->tag_stats[tag].requested_bytes.current;
      if (bytes != 0) live_by_tag.emplace_back(static_cast<TagId>(tag), bytes);
    }
  }
  std::int64_t total = 0;
  for (const auto& [tag, bytes] : live_by_tag) {
    const std::string region = name_of(tag_of(tag).region);
    // Whole components only: "::" and "." (module paths such as layers.1) both separate them,
    // so "layers" covers "layers.0" and "layers.1" does not cover "layers.10".
    const bool covered = region.size() >= region_prefix.size() &&
                         region.compare(0, region_prefix.size(), region_prefix) == 0 &&
                         (region.size() == region_prefix.size() || region_prefix.empty() ||
                          region.compare(region_prefix.size(), 2, "::") == 0 || region[region_prefix.size()] == '.');
    if (covered) total += bytes;
  }
  return total;
}

int CachingAllocator::device() const {
  std::lock_guard lock(state_->mutex);
  return state_->backend->device();
}

Backend& CachingAllocator::backend() {
  std::lock_guard lock(state_->mutex);
  return *state_->backend;
}

}  // namespace remat::alloc
