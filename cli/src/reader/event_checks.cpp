#include "reader/event_checks.hpp"

#include "core/address_ranges.hpp"
#include "core/errors.hpp"

#include <fmt/format.h>

#include <iterator>
#include <utility>

namespace remat::report {

EventError::EventError(std::uint64_t event_number, std::string field_name, std::string what)
    : InputError(fmt::format("event {}: $.{}", event_number, field_name), what),
      event(event_number),
      field(std::move(field_name)),
      problem(std::move(what)) {}

std::string EventChecker::event_name(std::uint64_t event) const {
  return name_event_ ? name_event_(event) : fmt::format("event {}", event);
}

void EventChecker::fail(std::string_view field, const std::string& problem) const {
  throw EventError(events_, std::string(field), problem);
}

void EventChecker::check(const Event& event) {
  ++events_;
  if (events_ == 1) {
    first_time_ = event.time_us;
  } else if (event.time_us < last_time_) {
    fail("time_us", fmt::format("events are out of time order ({} after {})", event.time_us, last_time_));
  }
  std::int64_t span = 0;
  if (__builtin_sub_overflow(event.time_us, first_time_, &span)) {
    fail("time_us", fmt::format("{} is too far from the first event's time {}: the span does not fit in 64 bits",
                                event.time_us, first_time_));
  }
  last_time_ = event.time_us;

  std::uint64_t end = 0;
  const bool has_extent = event.action == Action::alloc || event.action == Action::segment_alloc;
  if (has_extent && __builtin_add_overflow(event.address, event.size, &end)) {
    fail("size", fmt::format("{} bytes at 0x{:x} end past the 64-bit address space", event.size, event.address));
  }
  switch (event.action) {
    case Action::alloc: {
      if (const Allocation* live = blocks_.find(event.address)) {
        fail("address", fmt::format("alloc at 0x{:x} while the block allocated there by {} is still live (no "
                                    "free_requested or free_completed between them): events were lost or the dump is "
                                    "corrupt",
                                    event.address, event_name(live->event)));
      }
      if (__builtin_add_overflow(live_bytes_, event.size, &live_bytes_)) {
        fail("size", fmt::format("live bytes overflow 64 bits with this allocation of {} bytes", event.size));
      }
      blocks_.put(event.address, Allocation{event.size, events_});
      break;
    }
    case Action::free_requested:
    case Action::free_completed:
      if (const Allocation* live = blocks_.find(event.address)) {
        live_bytes_ -= live->size;
        blocks_.erase(event.address);
      }
      break;
    case Action::segment_alloc: {
      if (const auto found = segments_.find(event.address); found != segments_.end()) {
        const Allocation* reserved = &found->second;
        fail("address", fmt::format("segment_alloc at 0x{:x} while the segment allocated there by {} is still "
                                    "reserved (no segment_free between them): events were lost or the dump is corrupt",
                                    event.address, event_name(reserved->event)));
      }
      // A reserved segment the new one overlaps: the one before it reaching into it, or the one after
      // it starting inside it (the extent is checked against the address space above)
      auto after = segments_.upper_bound(event.address);
      const auto overlapped = [&]() -> const std::pair<const std::uint64_t, Allocation>* {
        if (after != segments_.begin()) {
          const auto before = std::prev(after);
          if (before->first + before->second.size > event.address) return &*before;
        }
        if (after != segments_.end() && after->first < event.address + event.size) return &*after;
        return nullptr;
      }();
      if (overlapped != nullptr) {
        fail("address", fmt::format("segment_alloc of {} bytes at 0x{:x} overlaps the segment of {} bytes at 0x{:x} "
                                    "that {} allocated and no segment_free released: events were lost or the dump is "
                                    "corrupt",
                                    event.size, event.address, overlapped->second.size, overlapped->first,
                                    event_name(overlapped->second.event)));
      }
      if (__builtin_add_overflow(reserved_bytes_, event.size, &reserved_bytes_)) {
        fail("size", fmt::format("reserved bytes overflow 64 bits with this segment of {} bytes", event.size));
      }
      segments_[event.address] = Allocation{event.size, events_};
      break;
    }
    case Action::segment_free: {
      // Releases what the range covers: one whole segment, or under expandable segments the
      // end of one or several mapped ranges (PyTorch's segment_unmap, our shrink on empty_cache).
      reserved_bytes_ -= cut_ranges(segments_, event.address, event.size);
      break;
    }
    case Action::oom:
    case Action::retag: break;  // a retag of an address not live (its alloc before the trace) changes nothing
  }
}

}  // namespace remat::report
