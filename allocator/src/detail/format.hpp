#pragma once
// Small text helpers for the allocator's messages (byte counts: <remat/alloc/bytes.hpp>).

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace remat::alloc::detail {

// `text` in single quotes for a message; past `limit` bytes, its first `limit` bytes (never
// half a UTF-8 character) and its length, so a huge value is not echoed in full.
inline std::string quote(std::string_view text, std::size_t limit = 64) {
  if (text.size() <= limit) return "'" + std::string(text) + "'";
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return "'" + std::string(text.substr(0, cut)) + "...' (" + std::to_string(text.size()) + " bytes)";
}

inline std::string format_address(std::uint64_t address) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

}  // namespace remat::alloc::detail
