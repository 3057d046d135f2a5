#include <remat/alloc/trace.hpp>

#include <ctime>

namespace remat::alloc {
namespace {

std::int64_t now_us() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000 + ts.tv_nsec / 1000;
}

}  // namespace

std::string_view to_string(TraceAction action) {
  switch (action) {
    case TraceAction::alloc: return "alloc";
    case TraceAction::free_requested: return "free_requested";
    case TraceAction::free_completed: return "free_completed";
    case TraceAction::segment_alloc: return "segment_alloc";
    case TraceAction::segment_free: return "segment_free";
    case TraceAction::oom: return "oom";
    case TraceAction::retag: return "retag";
  }
  return "unknown";
}

#if !defined(__x86_64__)
std::uint64_t TraceRing::ticks() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000 + static_cast<std::uint64_t>(ts.tv_nsec);
}
#endif

void TraceRing::resize(std::size_t capacity) {
  events_.assign(capacity, RawEvent{});
  events_.shrink_to_fit();
  next_ = 0;
  recorded_ = 0;
  origin_ticks_ = ticks();
  origin_us_ = now_us();
}

std::vector<TraceEvent> TraceRing::events(std::size_t limit) const {
  const std::size_t capacity = events_.size();
  const std::size_t held = recorded_ < capacity ? static_cast<std::size_t>(recorded_) : capacity;
  // Walk back from the newest record until `limit` events are covered.
  std::size_t records = 0;
  std::size_t covered = 0;
  while (records < held && covered < limit) {
    const RawEvent& raw = events_[(next_ + capacity - 1 - records) % capacity];
    covered += raw.completed_at_once ? 2 : 1;
    ++records;
  }
  const std::uint64_t now_ticks = ticks();
  const std::int64_t now = now_us();
  const double us_per_tick = now_ticks > origin_ticks_ ? static_cast<double>(now - origin_us_) /
                                                             static_cast<double>(now_ticks - origin_ticks_)
                                                       : 0.0;
  std::vector<TraceEvent> out;
  out.reserve(covered);
  std::size_t index = records == 0 ? 0 : (next_ + capacity - records) % capacity;
  for (std::size_t i = 0; i < records; ++i) {
    const RawEvent& raw = events_[index];
    const std::int64_t time = origin_us_ + static_cast<std::int64_t>(static_cast<double>(raw.ticks - origin_ticks_) *
                                                                      us_per_tick);
    out.push_back(TraceEvent{time, raw.address, raw.size, raw.stream, raw.tag, raw.action, raw.requested});
    if (raw.completed_at_once) {
      out.push_back(TraceEvent{time, raw.address, raw.size, raw.stream, raw.tag, TraceAction::free_completed});
    }
    if (++index == capacity) index = 0;
  }
  // The oldest record may be an immediate free of which only the completion fits.
  if (out.size() > limit) out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(out.size() - limit));
  return out;
}

}  // namespace remat::alloc
