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
  }
  return "unknown";
}

void TraceRing::record(TraceAction action, std::uint64_t address, std::uint64_t size, Stream stream, TagId tag) {
  if (events_.empty()) return;
  TraceEvent& event = events_[recorded_ % events_.size()];
  event = TraceEvent{now_us(), address, size, stream, tag, action};
  ++recorded_;
}

void TraceRing::resize(std::size_t capacity) {
  events_.assign(capacity, TraceEvent{});
  events_.shrink_to_fit();
  recorded_ = 0;
}

std::vector<TraceEvent> TraceRing::events(std::size_t limit) const {
  const std::size_t held = recorded_ < events_.size() ? static_cast<std::size_t>(recorded_) : events_.size();
  const std::size_t count = held < limit ? held : limit;
  std::vector<TraceEvent> out;
  out.reserve(count);
  for (std::uint64_t i = recorded_ - count; i < recorded_; ++i) out.push_back(events_[i % events_.size()]);
  return out;
}

}  // namespace remat::alloc
