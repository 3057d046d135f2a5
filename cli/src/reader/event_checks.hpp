#pragma once
// The consistency every stream of allocator events must have, checked in one place for every
// dump kind and subcommand, so that no view prints an impossible figure:
//   - events in time order, the whole span within 64 bits of microseconds;
//   - every block and segment ends within the 64-bit address space;
//   - live bytes and reserved bytes stay within 64 bits;
//   - no `alloc` at an address whose block is still live, no `segment_alloc` at an address
//     whose segment is still reserved (the events between were lost, or the dump is corrupt).
// A free of an address the stream never allocated is allowed: the dump may have begun after
// the allocation (a ring buffer that dropped its oldest events).

#include <remat/alloc/address_map.hpp>

#include "core/errors.hpp"
#include "model/dump.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace remat::report {

// An event that breaks the stream's consistency: which event (counted from 1), which field,
// and what is wrong, for callers that name the event their own way (import names the pickle's path).
class EventError : public InputError {
 public:
  EventError(std::uint64_t event, std::string field, std::string problem);
  std::uint64_t event;
  std::string field;
  std::string problem;
};

class EventChecker {
 public:
  // Checks the next event. Throws EventError, an InputError "event N: $.field: <problem>", N
  // counting the stream's events from 1.
  void check(const Event& event);
  // How messages name an earlier event, given its number counted from 1 ("event 3" unless
  // set: import names the pickle entry it came from instead).
  void name_events_by(std::function<std::string(std::uint64_t)> name) { name_event_ = std::move(name); }
  // How many events check has seen, a refused one included.
  std::uint64_t events() const { return events_; }

 private:
  struct Allocation {
    std::uint64_t size = 0;
    std::uint64_t event = 0;  // the event that made it, counted from 1
  };
  [[noreturn]] void fail(std::string_view field, const std::string& problem) const;

  std::string event_name(std::uint64_t event) const;

  std::function<std::string(std::uint64_t)> name_event_;
  alloc::AddressMap<Allocation> blocks_;
  // Ordered: a segment_free may release the end of one or several ranges (expandable segments).
  std::map<std::uint64_t, Allocation> segments_;
  std::uint64_t events_ = 0;
  std::uint64_t live_bytes_ = 0;
  std::uint64_t reserved_bytes_ = 0;
  std::int64_t first_time_ = 0;
  std::int64_t last_time_ = 0;
};

}  // namespace remat::report
