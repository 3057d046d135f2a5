#pragma once
// The hot path for trace lines: a flat event object in its usual shape (the six event keys
// once each and an optional "requested", in any order, string and integer values, plain
// ASCII) is decoded without a
// general JSON parser. Anything else -- another key, a key twice, an escape -- is left to the
// full parser, which also produces the error message.

#include <cstdint>
#include <string_view>

namespace remat::report {

struct RawEvent {
  std::string_view action;
  std::int64_t time_us = 0;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::uint64_t tag = 0;
  std::uint64_t requested = 0;  // optional: 0 when the line has no "requested"
};

// True when `line` is a well-formed event object this decoder fully understood, with all
// six fields present; false means "ask the full parser" (not necessarily an error).
bool decode_event_line(std::string_view line, RawEvent& out);

}  // namespace remat::report
