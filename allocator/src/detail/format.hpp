#pragma once
// Small text helpers for the allocator's messages (byte counts: <remat/alloc/bytes.hpp>).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace remat::alloc::detail {

// `text` in single quotes for a message; past `limit` bytes, its first `limit` bytes (never
// half a UTF-8 character) and its length, so a huge value is not echoed in full.
inline std::string quote(std::string_view text, std::size_t limit = 64) {
  std::size_t cut = std::min(limit, text.size());
  while (cut < text.size() && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  // Built by appending: GCC 12 at -O3 misreads "'" + std::string(...) as an overlapping copy.
  std::string quoted;
  quoted.reserve(cut + 32);
  quoted.append(1, '\'').append(text.substr(0, cut));
  if (cut == text.size()) return quoted.append(1, '\'');
  return quoted.append("...' (").append(std::to_string(text.size())).append(" bytes)");
}

inline std::string format_address(std::uint64_t address) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

}  // namespace remat::alloc::detail
