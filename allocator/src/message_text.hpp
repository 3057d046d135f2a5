#pragma once
// Small text helpers for the allocator's messages (byte counts: <remat/alloc/bytes.hpp>).

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace remat::alloc::detail {

// The first `limit` bytes of `text` (never half a UTF-8 character) with control bytes as
// \xNN, so that a message stays on one line and cannot drive a terminal; `cut` when shortened.
struct ShownText {
  std::string text;
  bool cut = false;
};
inline ShownText shown_text(std::string_view text, std::size_t limit) {
  std::size_t keep = std::min(limit, text.size());
  while (keep < text.size() && keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  ShownText shown;
  shown.text.reserve(keep + 8);
  for (const char c : text.substr(0, keep)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", byte);
      shown.text.append(escaped);
    } else {
      shown.text.push_back(c);
    }
  }
  shown.cut = keep < text.size();
  return shown;
}

// `text` for a message: shown_text, then "... (N bytes)" when it was cut.
inline std::string printable(std::string_view text, std::size_t limit = 64) {
  ShownText shown = shown_text(text, limit);
  if (shown.cut) shown.text.append("... (").append(std::to_string(text.size())).append(" bytes)");
  return std::move(shown.text);
}

// `text` in single quotes for a message: 'name', or 'first bytes...' (N bytes).
inline std::string quote(std::string_view text, std::size_t limit = 64) {
  const ShownText shown = shown_text(text, limit);
  // Built by appending: GCC 12 at -O3 misreads "'" + std::string(...) as an overlapping copy.
  std::string quoted;
  quoted.reserve(shown.text.size() + 32);
  quoted.append(1, '\'').append(shown.text);
  if (!shown.cut) return quoted.append(1, '\'');
  return quoted.append("...' (").append(std::to_string(text.size())).append(" bytes)");
}

// The shortest text that reads back as `value`: 1.0000001, where %f would print 1.000000.
inline std::string shortest_text(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

inline std::string format_address(std::uint64_t address) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

}  // namespace remat::alloc::detail
