#pragma once
// A caching device allocator over a Backend that tags every block. Behaviour follows
// PyTorch's CUDA caching allocator: 512 B rounding, small (<= 1 MiB, 2 MiB segments) and
// large pools, best fit, splitting and merging, per-stream reuse, record-stream, release
// of cached blocks and retry before OOM, memory-fraction cap and max-split-size, expandable
// segments, garbage collection of cached blocks.

#include <remat/alloc/allocator_snapshot.hpp>
#include <remat/alloc/backend.hpp>
#include <remat/alloc/config.hpp>
#include <remat/alloc/oom.hpp>
#include <remat/alloc/size_classes.hpp>
#include <remat/alloc/stats.hpp>
#include <remat/alloc/tags.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace remat::alloc {

namespace detail {
struct PoolState;
}

class CachingAllocator {
 public:
  CachingAllocator(std::unique_ptr<Backend> backend, const Config& config);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns nullptr for size 0. Throws OutOfMemoryError when the request cannot be met even
  // after releasing cached blocks (the pool stays usable), or for sizes above
  // kMaxRequestSize. Before throwing it writes an OOM report (rate-limited; into
  // oom_dump_dir or $REMAT_OOM_DUMP_DIR when set), prints one line to stderr and calls the
  // OOM handler, all without the lock held.
  void* allocate(std::size_t size, Stream stream);
  // `expected_size`, when nonzero, must equal the size given to allocate. Throws
  // InvalidPointerError (unknown pointer, double free, wrong size); state is unchanged then.
  void deallocate(void* ptr, std::size_t expected_size = 0);
  // The block behind `ptr` is also used on `stream`: it is reused only after that stream's
  // work enqueued before the free has completed.
  void record_stream(void* ptr, Stream stream);
  // Returns every fully free segment, and every whole free granule of expandable segments, to
  // the backend.
  void empty_cache();
  // Returns exactly [address, address + bytes) to the backend when it is cached memory that
  // empty_cache would give back as one piece (a whole free segment, or the whole free granules
  // of one free block of an expandable segment), after retiring the frees whose stream work has
  // completed; false, with nothing given back, when it is not. `whatif` replays a recording's
  // releases one by one with it.
  bool release_cached_range(std::uintptr_t address, std::size_t bytes);
  // Applies config keys that can change on a live allocator (all but backend and
  // host_capacity_mb, which need replace_backend). Blocks already in fixed or expandable
  // segments stay where they are when expandable_segments changes.
  void apply_config(const Config& config);
  // Swaps the backend; only while nothing is allocated (throws StateError otherwise).
  void replace_backend(std::unique_ptr<Backend> backend, const Config& config);
  void set_oom_handler(OomHandler handler);
  // Off: an out-of-memory error only throws OutOfMemoryError, with no report, no dump, no
  // stderr line and no handler call (for replays that expect to run out).
  void set_oom_reporting(bool enabled);

  AllocatorStats stats() const;
  void reset_peak_stats();
  // The most requested bytes held since the previous call (or since the allocator began); the
  // next window starts now. The peak statistics are not touched: they are the user's.
  std::int64_t take_requested_window_peak();
  // Zeroes the cumulative totals and the OOM and retry counts (PyTorch's
  // reset_accumulated_memory_stats); current figures and peaks stay.
  void reset_accumulated_stats();
  AllocatorSnapshot snapshot() const;
  // Trace events ever recorded (TraceRing::events_recorded()).
  std::uint64_t trace_events_recorded() const;
  // Statistics of every tag that ever allocated, without the snapshot's segments and trace.
  std::vector<TagStatsEntry> tag_stats() const;
  // The tag of the live block that starts at `ptr`, if this allocator returned it.
  std::optional<TagId> tag_of_block(const void* ptr) const;
  // Gives the live block that starts at `ptr` the tag `tag` (its bytes move between the two
  // tags' statistics; a retag event tells the trace) and returns its previous tag, or nullopt,
  // changing nothing, when this allocator did not return `ptr`.
  std::optional<TagId> retag_block(const void* ptr, TagId tag);
  // The same with the tag `next(previous tag)`, in one look-up: for callers that re-tag by what a
  // block is (tracking's activations, once per saved tensor). `next` runs under the pool's lock.
  std::optional<TagId> retag_block(const void* ptr, TagId (*next)(TagId));
  // Requested bytes currently live under regions whose path starts with `prefix`.
  std::int64_t live_requested_bytes(std::string_view region_prefix) const;
  // The largest free cached block, in bytes (0 when none is cached), without a snapshot.
  std::size_t largest_free_block() const;
  // The settings in force.
  Config config() const;
  int device() const;
  Backend& backend();
  // For fork handlers only: take the allocator's lock before fork() and release it after, in
  // parent and child, so that no other thread holds it in the child.
  void hold_for_fork();
  void release_after_fork();

 private:
  std::unique_ptr<detail::PoolState> state_;
};

}  // namespace remat::alloc
