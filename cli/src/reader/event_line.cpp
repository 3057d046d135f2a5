#include "reader/event_line.hpp"

namespace remat::report {

namespace {

enum Field : unsigned {
  kAction = 1,
  kTime = 2,
  kAddress = 4,
  kSize = 8,
  kStream = 16,
  kTag = 32,
  kAll = 63,  // the fields every event has
  kRequested = 64,
};

inline const char* skip_space(const char* p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) ++p;
  return p;
}

// A JSON string without escapes, control bytes or non-ASCII bytes; p points after the quote.
inline const char* scan_plain_string(const char* p, const char* end) {
  while (p < end) {
    const auto c = static_cast<unsigned char>(*p);
    if (c == '"') return p;
    if (c == '\\' || c < 0x20 || c >= 0x80) return nullptr;
    ++p;
  }
  return nullptr;
}

// A JSON integer (no fraction or exponent) that fits its target; nullptr otherwise.
inline const char* scan_integer(const char* p, const char* end, bool allow_negative, std::uint64_t& magnitude,
                                bool& negative) {
  negative = false;
  if (p < end && *p == '-') {
    if (!allow_negative) return nullptr;
    negative = true;
    ++p;
  }
  if (p >= end || *p < '0' || *p > '9') return nullptr;
  if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9') return nullptr;
  std::uint64_t value = 0;
  const char* start = p;
  while (p < end && *p >= '0' && *p <= '9') {
    if (p - start >= 19) {  // a 20th digit may overflow: leave it to the full parser
      return nullptr;
    }
    value = value * 10 + static_cast<std::uint64_t>(*p - '0');
    ++p;
  }
  if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return nullptr;
  magnitude = value;
  return p;
}

}  // namespace

bool decode_event_line(std::string_view line, RawEvent& out) {
  const char* p = line.data();
  const char* const end = p + line.size();
  unsigned seen = 0;
  out.requested = 0;
  p = skip_space(p, end);
  if (p >= end || *p != '{') return false;
  p = skip_space(p + 1, end);
  if (p < end && *p == '}') return false;
  for (;;) {
    if (p >= end || *p != '"') return false;
    const char* key_begin = p + 1;
    const char* key_end = scan_plain_string(key_begin, end);
    if (key_end == nullptr) return false;
    const std::string_view key(key_begin, static_cast<std::size_t>(key_end - key_begin));
    p = skip_space(key_end + 1, end);
    if (p >= end || *p != ':') return false;
    p = skip_space(p + 1, end);
    if (p >= end) return false;

    unsigned field = 0;
    if (key == "action")
      field = kAction;
    else if (key == "time_us")
      field = kTime;
    else if (key == "address")
      field = kAddress;
    else if (key == "size")
      field = kSize;
    else if (key == "stream")
      field = kStream;
    else if (key == "tag")
      field = kTag;
    else if (key == "requested")
      field = kRequested;
    else
      return false;                         // another key: the full parser checks the whole object
    if ((seen & field) != 0) return false;  // duplicate key: refused by the full parser
    seen |= field;

    if (*p == '"') {
      const char* value_end = scan_plain_string(p + 1, end);
      if (value_end == nullptr) return false;
      if (field != kAction) return false;  // wrong type: the full parser reports it
      out.action = std::string_view(p + 1, static_cast<std::size_t>(value_end - p - 1));
      p = value_end + 1;
    } else {
      if (field == kAction) return false;
      std::uint64_t magnitude = 0;
      bool negative = false;
      const char* value_end = scan_integer(p, end, field == kTime, magnitude, negative);
      if (value_end == nullptr) return false;
      switch (field) {
        case kTime:
          if (magnitude > static_cast<std::uint64_t>(INT64_MAX)) return false;
          out.time_us = negative ? -static_cast<std::int64_t>(magnitude) : static_cast<std::int64_t>(magnitude);
          break;
        case kAddress: out.address = magnitude; break;
        case kSize: out.size = magnitude; break;
        case kStream: out.stream = magnitude; break;
        case kTag: out.tag = magnitude; break;
        case kRequested: out.requested = magnitude; break;
        default: break;
      }
      p = value_end;
    }
    p = skip_space(p, end);
    if (p >= end) return false;
    if (*p == ',') {
      p = skip_space(p + 1, end);
      continue;
    }
    if (*p != '}') return false;
    p = skip_space(p + 1, end);
    return p == end && (seen & kAll) == kAll;
  }
}

}  // namespace remat::report
