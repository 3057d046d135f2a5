#include "core/terminal_text.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

// Length of the valid UTF-8 sequence starting at text[i], or 0 when the byte there starts none.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // allowed range of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf)
    length = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    length = 3;
    if (c == 0xe0)
      low = 0xa0;  // no overlong forms
    else if (c == 0xed)
      high = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    length = 4;
    if (c == 0xf0)
      low = 0x90;
    else if (c == 0xf4)
      high = 0x8f;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  }
  return length;
}

bool is_c1_control(std::string_view text, std::size_t i) {
  return static_cast<unsigned char>(text[i]) == 0xc2 && static_cast<unsigned char>(text[i + 1]) <= 0x9f;
}

}  // namespace

std::uint32_t invisible_format_character(std::string_view text, std::size_t i, std::size_t length) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  if (length == 2 && byte(0) == 0xd8 && byte(1) == 0x9c) return 0x061c;  // ARABIC LETTER MARK
  if (length != 3 || byte(0) != 0xe2) return 0;
  const std::uint32_t code = 0x2000u | ((byte(1) & 0x3fu) << 6) | (byte(2) & 0x3fu);
  const bool zero_width_or_mark = code >= 0x200b && code <= 0x200f;  // ZWSP, ZWNJ, ZWJ, LRM, RLM
  const bool embedding = code >= 0x202a && code <= 0x202e;           // LRE, RLE, PDF, LRO, RLO
  const bool isolate = code >= 0x2066 && code <= 0x2069;             // LRI, RLI, FSI, PDI
  return zero_width_or_mark || embedding || isolate ? code : 0;
}

bool has_no_controls(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      ++i;
      continue;
    }
    const std::size_t length = utf8_length(text, i);
    if (length < 2 || (length == 2 && is_c1_control(text, i))) return false;
    if (invisible_format_character(text, i, length) != 0) return false;
    i += length;
  }
  return true;
}

std::string escape_controls(std::string_view text) {
  if (has_no_controls(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const std::size_t length = utf8_length(text, i);
    if (length == 0) {  // not UTF-8
      out += fmt::format("\\x{:02x}", c);
      ++i;
      continue;
    }
    if (length == 1) {  // C0 control or DEL
      out += fmt::format("\\u{:04x}", c);
    } else if (length == 2 && is_c1_control(text, i)) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(text[i + 1]));
    } else if (const std::uint32_t code = invisible_format_character(text, i, length); code != 0) {
      out += fmt::format("\\u{:04x}", code);
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

}  // namespace remat::report
