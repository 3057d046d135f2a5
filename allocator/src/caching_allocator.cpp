// The caching pool's public operations: each locks the pool's state (detail/pool_state.hpp),
// applies its mechanics, tells the books (detail/ledger.hpp) what happened, and reports
// out-of-memory.
#include <remat/alloc/bytes.hpp>
#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/errors.hpp>

#include "detail/cache_release.hpp"
#include "detail/pool_diagnostics.hpp"
#include "detail/pool_state.hpp"
#include "detail/segment_memory.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

namespace remat::alloc {

using detail::Block;
using detail::format_address;
using detail::PoolState;

std::string_view to_string(BlockState state) {
  switch (state) {
    case BlockState::active_allocated: return "active_allocated";
    case BlockState::active_pending_free: return "active_pending_free";
    case BlockState::inactive: break;
  }
  return "inactive";
}

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, const Config& config)
    : state_(std::make_unique<PoolState>(std::move(backend), config)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(state_->mutex);
  state_->process_pending_frees(true);
  detail::release_cached_blocks(*state_);
  // Segments that still hold live blocks (a pool dropped mid-run, as `whatif` drops a run that
  // failed): their memory goes with the backend, their block records with the pool.
  for (const auto& [address, head] : state_->segments) {
    for (Block* block = head; block != nullptr;) delete std::exchange(block, block->next);
  }
  for (Block* block = state_->spare_blocks; block != nullptr;) delete std::exchange(block, block->next);
}

namespace {

// The paths off the cached pair (new memory, the retry, out-of-memory, bad frees) stay out of
// allocate() and deallocate(): inlined there, their size made GCC stop inlining the hot
// helpers (take_free_block, merge, recycle), a measured 20% on the traced pair.

// Builds the report under the lock, then releases it to dump, announce and throw.
[[noreturn, gnu::noinline, gnu::cold]] void report_out_of_memory(PoolState& s,
                                                                 std::unique_lock<detail::AdaptiveMutex>& lock,
                                                                 std::size_t size, std::size_t rounded,
                                                                 std::size_t segment_size, TagId tag) {
  if (!s.oom_reporting) {
    lock.unlock();
    throw OutOfMemoryError("out of memory on device " + std::to_string(s.backend->device()) + ": tried to allocate " +
                           format_bytes(size));
  }
  OomEvent event;
  event.device = s.backend->device();
  event.requested_bytes = size;
  event.rounded_bytes = rounded;
  event.reserved_bytes = s.books.device_stats().reserved_bytes.current;
  event.allocated_bytes = s.books.device_stats().allocated_bytes.current;
  event.tag = tag;
  bool may_dump = false;
  try {
    auto report = std::make_shared<OomReport>(build_oom_report(
        detail::figures_for_oom_report(s, rounded <= kSmallRequestLimit), size, rounded, segment_size));
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

[[noreturn, gnu::noinline, gnu::cold]] void reject_impossible_request(PoolState& s, std::size_t size) {
  std::lock_guard lock(s.mutex);
  s.books.impossible_request();
  throw OutOfMemoryError("request of " + std::to_string(size) + " bytes (" + format_bytes(size) +
                         ") exceeds what any device holds (limit " + format_bytes(kMaxRequestSize) +
                         "); check the size computation that produced it");
}

// No cached block fits: new memory, else (like PyTorch) wait for freed blocks still in use by
// streams, give every cached segment back, and try once more before declaring out-of-memory.
[[gnu::noinline]] Block* block_from_new_memory(PoolState& s, std::unique_lock<detail::AdaptiveMutex>& lock,
                                               std::size_t size, std::size_t rounded, bool small, Stream stream,
                                               TagId tag) {
  detail::collect_garbage(s);
  Block* block = detail::new_memory(s, rounded, stream, small);
  if (block == nullptr) {
    s.books.retried();
    s.process_pending_frees(true);
    detail::release_cached_blocks(s);
    block = s.take_free_block(small, stream, rounded);
    if (block == nullptr) block = detail::new_memory(s, rounded, stream, small);
  }
  if (block == nullptr) {
    s.books.out_of_memory(rounded, size, stream, tag);
    const std::size_t segment_size = s.config.expandable_segments
                                         ? detail::round_up(rounded, detail::growth_step(s, small))
                                         : segment_size_for(rounded, s.config.large_segment_size_bytes);
    report_out_of_memory(s, lock, size, rounded, segment_size, tag);
  }
  return block;
}

[[noreturn, gnu::noinline, gnu::cold]] void reject_free(PoolState& s, std::uintptr_t address, std::size_t expected_size,
                                                        const Block* block) {
  s.books.invalid_free();
  if (block == nullptr) throw InvalidPointerError(detail::describe_bad_pointer(s, address));
  throw InvalidPointerError("free of " + format_address(address) + " with size " + std::to_string(expected_size) +
                            ", but it was allocated with size " + std::to_string(block->requested) +
                            "; pass the size given at allocation (the block stays allocated)");
}

}  // namespace

void* CachingAllocator::allocate(std::size_t size, Stream stream) {
  if (size == 0) return nullptr;
  if (size > kMaxRequestSize) reject_impossible_request(*state_, size);
  PoolState& s = *state_;
  std::unique_lock<detail::AdaptiveMutex> lock(s.mutex);
  const TagId tag = s.config.tagging ? current_tag_id() : 0;
  if (!s.pending_frees.empty()) s.process_pending_frees(false);

  const std::size_t rounded = round_request_size(size, s.config.roundup_power2_divisions.data());
  const bool small = rounded <= kSmallRequestLimit;
  Block* block = s.take_free_block(small, stream, rounded);
  if (block == nullptr) block = block_from_new_memory(s, lock, size, rounded, small, stream, tag);
  s.split(block, rounded);
  block->allocated = true;
  block->oversize = block->size >= s.config.max_split_size_bytes;
  block->requested = size;
  block->tag = tag;
  s.live.put(block->address, block);
  s.books.allocated(*block);
  return reinterpret_cast<void*>(block->address);
}

void CachingAllocator::deallocate(void* ptr, std::size_t expected_size) {
  if (ptr == nullptr) return;
  PoolState& s = *state_;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(s.mutex);
  Block* block = s.live_block(address);
  if (block == nullptr || (expected_size != 0 && expected_size != block->requested)) {
    reject_free(s, address, expected_size, block);
  }
  s.live.erase(address);
  block->allocated = false;
  const bool free_now = block->stream_uses.empty();
  s.books.freed(*block, free_now);
  if (free_now) {
    s.complete_free(block);
    return;
  }
  for (const Stream used_on : block->stream_uses) {
    s.pending_frees.add(s.backend->record_event(used_on), block);
  }
  block->stream_uses.clear();
}

void CachingAllocator::record_stream(void* ptr, Stream stream) {
  PoolState& s = *state_;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(s.mutex);
  Block* block = s.live_block(address);
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
  detail::release_cached_blocks(*state_);
}

bool CachingAllocator::release_cached_range(std::uintptr_t address, std::size_t bytes) {
  PoolState& s = *state_;
  std::lock_guard lock(s.mutex);
  s.process_pending_frees(false);
  Block* block = s.block_holding(address);
  if (block == nullptr || !block->is_free()) return false;
  if (block->expandable == nullptr) {
    if (!block->is_whole_segment() || block->address != address || block->size != bytes) return false;
    s.erase_free(block);
    detail::release_segment(s, block);
    return true;
  }
  const auto [low, high] = block->expandable->whole_granules(*block, s.backend->granularity());
  if (low != address || high - low != bytes) return false;
  detail::unmap_free_pages(s, block);
  return true;
}

void CachingAllocator::apply_config(const Config& config) {
  PoolState& s = *state_;
  std::lock_guard lock(s.mutex);
  detail::check_backend_supports(*s.backend, config);
  if (config.trace_entries != s.config.trace_entries) s.books.resize_trace(config.trace_entries);
  s.reserved_limit = detail::reserved_cap(*s.backend, config);
  s.config = config;
}

void CachingAllocator::replace_backend(std::unique_ptr<Backend> backend, const Config& config) {
  PoolState& s = *state_;
  std::lock_guard lock(s.mutex);
  if (s.live.size() != 0 || !s.pending_frees.empty()) {
    throw StateError("cannot switch the backend of device " + std::to_string(s.backend->device()) + " while " +
                     std::to_string(s.live.size()) + " blocks are live; configure the backend before the first "
                     "allocation or free everything first");
  }
  detail::check_backend_supports(*backend, config);
  detail::release_cached_blocks(s);
  s.backend = std::move(backend);
  if (config.trace_entries != s.config.trace_entries) s.books.resize_trace(config.trace_entries);
  s.reserved_limit = detail::reserved_cap(*s.backend, config);
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
  return state_->books.stats();
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(state_->mutex);
  state_->books.reset_peaks();
}

std::int64_t CachingAllocator::take_requested_window_peak() {
  std::lock_guard lock(state_->mutex);
  return state_->books.take_requested_window_peak();
}

std::uint64_t CachingAllocator::trace_events_recorded() const {
  std::lock_guard lock(state_->mutex);
  return state_->books.trace().events_recorded();
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard lock(state_->mutex);
  state_->books.reset_accumulated();
}

AllocatorSnapshot CachingAllocator::snapshot() const {
  const PoolState& s = *state_;
  std::lock_guard lock(s.mutex);
  AllocatorSnapshot out;
  out.device = s.backend->device();
  out.backend = std::string(s.backend->name());
  out.config = s.config;
  out.stats = s.books.stats();
  out.memory = s.backend->memory_info();
  out.tag_stats = s.books.tags_that_allocated();
  out.segments.reserve(s.segments.size());
  // As PyTorch: each mapped run of an expandable segment (between its holes) is one segment.
  for (const auto& [address, head] : s.segments) {
    SegmentInfo segment;
    for (const Block* block = head; block != nullptr; block = block->next) {
      if (!block->mapped) continue;
      if (segment.blocks.empty()) {
        segment.address = block->address;
        segment.stream = block->stream;
        segment.is_small = block->small;
        segment.is_expandable = block->expandable != nullptr;
      }
      const BlockState state = block->allocated ? BlockState::active_allocated
                               : block->pending_events > 0 ? BlockState::active_pending_free
                                                            : BlockState::inactive;
      segment.blocks.push_back({block->address, block->size, block->requested, state, block->tag});
      segment.total_size += block->size;
      if (block->next == nullptr || !block->next->mapped) out.segments.push_back(std::exchange(segment, {}));
    }
  }
  out.trace = s.books.trace().events();
  out.trace_capacity = s.books.trace().capacity();
  out.trace_dropped = s.books.trace().dropped();
  out.trace_events_recorded = s.books.trace().events_recorded();
  return out;
}

void CachingAllocator::hold_for_fork() { state_->mutex.lock(); }
void CachingAllocator::release_after_fork() { state_->mutex.unlock(); }

std::vector<TagStatsEntry> CachingAllocator::tag_stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->books.tags_that_allocated();
}

std::optional<TagId> CachingAllocator::tag_of_block(const void* ptr) const {
  std::lock_guard lock(state_->mutex);
  const Block* block = state_->live_block(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return std::nullopt;
  return block->tag;
}

std::size_t CachingAllocator::largest_free_block() const {
  const PoolState& s = *state_;
  std::lock_guard lock(s.mutex);
  std::size_t largest = 0;
  auto consider = [&](const Block* block) { largest = std::max(largest, block->size); };
  s.small_pool.for_each(consider);
  s.large_pool.for_each(consider);
  return largest;
}

Config CachingAllocator::config() const {
  std::lock_guard lock(state_->mutex);
  return state_->config;
}

std::optional<TagId> CachingAllocator::retag_block(const void* ptr, TagId tag) {
  std::lock_guard lock(state_->mutex);
  Block* block = state_->live_block(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return std::nullopt;
  const TagId previous = block->tag;
  if (previous != tag) state_->books.retagged(*block, tag);
  return previous;
}

std::optional<TagId> CachingAllocator::retag_block(const void* ptr, TagId (*next)(TagId)) {
  std::lock_guard lock(state_->mutex);
  Block* block = state_->live_block(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return std::nullopt;
  const TagId previous = block->tag;
  const TagId tag = next(previous);
  if (previous != tag) state_->books.retagged(*block, tag);
  return previous;
}

std::int64_t CachingAllocator::live_requested_bytes(std::string_view region_prefix) const {
  std::vector<std::pair<TagId, std::int64_t>> live_by_tag;
  {
    std::lock_guard lock(state_->mutex);
    live_by_tag = state_->books.live_requested_by_tag();
  }
  std::int64_t total = 0;
  for (const auto& [tag, bytes] : live_by_tag) {
    const std::string region = name_of(tag_of(tag).region);
    // Whole components only: "::" and "." (module paths such as layers.1) both separate them,
    // so "layers" covers "layers.0" and "layers.1" does not cover "layers.10".
    const bool covered = region.size() >= region_prefix.size() &&
                         region.compare(0, region_prefix.size(), region_prefix) == 0 &&
                         (region.size() == region_prefix.size() || region_prefix.empty() ||
                          region.compare(region_prefix.size(), kRegionSeparator.size(), kRegionSeparator) == 0 || region[region_prefix.size()] == '.');
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
