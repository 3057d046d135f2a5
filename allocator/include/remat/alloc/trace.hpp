#pragma once
// A bounded ring of allocator events, oldest overwritten first.

#include <remat/alloc/backend.hpp>
#include <remat/alloc/tags.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace remat::alloc {

// Names match PyTorch's memory snapshot trace actions, but for retag, which PyTorch has no word
// for: a live block given another tag in place (remat_alloc.track re-tags storages that exist);
// its `tag` is the block's new one, and readers move the block's bytes there from that event on.
enum class TraceAction : std::uint8_t {
  alloc,
  free_requested,
  free_completed,
  segment_alloc,
  segment_free,
  oom,
  retag,
};
inline constexpr int kTraceActionCount = 7;
std::string_view to_string(TraceAction action);

struct TraceEvent {
  std::int64_t time_us = 0;  // wall clock, microseconds since the Unix epoch
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  Stream stream = 0;
  TagId tag = 0;
  TraceAction action = TraceAction::alloc;
  // alloc, oom and retag: the bytes the caller asked for (`size` is the block's, or the rounded
  // request's); 0 on the other actions. A replay requests this, so it rounds as the pool did.
  std::uint64_t requested = 0;
};

// Events are stamped with a cheap tick counter on the hot path and converted to wall-clock
// microseconds when read, by interpolating between the ring's creation and the read.
class TraceRing {
 public:
  explicit TraceRing(std::size_t capacity = 0) { resize(capacity); }

  bool enabled() const noexcept { return !events_.empty(); }
  std::size_t capacity() const noexcept { return events_.size(); }
  // Records made but since overwritten (an immediate free is one record, two events).
  std::uint64_t dropped() const noexcept { return recorded_ > events_.size() ? recorded_ - events_.size() : 0; }
  std::uint64_t recorded() const noexcept { return recorded_; }
  // Events ever taken (an immediate free is two), across resizes: the events since a moment are
  // the newest (events_recorded() - what it was then) of events().
  std::uint64_t events_recorded() const noexcept { return events_recorded_; }

  void record(TraceAction action, std::uint64_t address, std::uint64_t size, Stream stream, TagId tag) {
    if (enabled()) put(RawEvent{ticks(), address, size, 0, stream, tag, action, false});
  }
  // An alloc, oom or retag event, with the size the caller asked for.
  void record_request(TraceAction action, std::uint64_t address, std::uint64_t size, std::uint64_t requested,
                      Stream stream, TagId tag) {
    if (enabled()) put(RawEvent{ticks(), address, size, requested, stream, tag, action, false});
  }
  // A free_requested whose free_completed follows at once (no other stream used the block):
  // one record, read back as both events with the same time, so the hot path reads the
  // clock once per free.
  void record_immediate_free(std::uint64_t address, std::uint64_t size, Stream stream, TagId tag) {
    if (enabled()) put(RawEvent{ticks(), address, size, 0, stream, tag, TraceAction::free_requested, true});
  }
  // Resizing clears the ring; capacity (in records) 0 switches tracing off.
  void resize(std::size_t capacity);
  // Oldest first; at most the last `limit` events.
  std::vector<TraceEvent> events(std::size_t limit = SIZE_MAX) const;

  static std::uint64_t ticks() noexcept;

 private:
  struct RawEvent {
    std::uint64_t ticks = 0;
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t requested = 0;
    Stream stream = 0;
    TagId tag = 0;
    TraceAction action = TraceAction::alloc;
    bool completed_at_once = false;  // a free_requested immediately followed by free_completed
  };

  // Only while enabled(): the clock is read before the event is built.
  void put(const RawEvent& event) {
    events_[next_] = event;
    if (++next_ == events_.size()) next_ = 0;
    ++recorded_;
    events_recorded_ += event.completed_at_once ? 2 : 1;
  }

  std::vector<RawEvent> events_;
  std::size_t next_ = 0;
  std::uint64_t recorded_ = 0;
  std::uint64_t events_recorded_ = 0;
  std::uint64_t origin_ticks_ = 0;
  std::int64_t origin_us_ = 0;
};

#if defined(__x86_64__)
inline std::uint64_t TraceRing::ticks() noexcept { return __builtin_ia32_rdtsc(); }
#endif

}  // namespace remat::alloc
