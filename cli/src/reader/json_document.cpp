#include "reader/json_document.hpp"

#include "core/errors.hpp"
#include "reader/duplicate_keys.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace remat::report {

std::size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if (c >= 0xc2 && c <= 0xdf)
      len = 2, cp = c & 0x1fu;
    else if (c >= 0xe0 && c <= 0xef)
      len = 3, cp = c & 0x0fu;
    else if (c >= 0xf0 && c <= 0xf4)
      len = 4, cp = c & 0x07u;
    else
      return i;
    if (i + len > n) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3fu);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
      return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

namespace {

// Accepts everything and records the first syntax error; builds no document.
struct SyntaxProbe {
  std::size_t position = 0;
  std::string message;
  bool failed = false;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(std::int64_t) { return true; }
  bool number_unsigned(std::uint64_t) { return true; }
  bool number_float(double, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(nlohmann::json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(std::string&) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::json::exception& error) {
    failed = true;
    position = pos;
    message = error.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
    if (const auto colon = message.find(": "); colon != std::string::npos) message = message.substr(colon + 2);
    return false;
  }
};

// Structural problems nlohmann accepts but simdjson rejects: nesting depth and integers that
// fit no 64-bit type. Returns the offset or npos.
std::size_t find_structural_limit(std::string_view text, std::string& what) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > simdjson::DEFAULT_MAX_DEPTH) {
        what = fmt::format("nesting deeper than {} levels", simdjson::DEFAULT_MAX_DEPTH);
        return i;
      }
    } else if (c == '}' || c == ']') {
      if (depth > 0) --depth;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      std::size_t j = i + (c == '-' ? 1 : 0);
      const std::size_t digits_begin = j;
      while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
      const bool fraction = j < text.size() && (text[j] == '.' || text[j] == 'e' || text[j] == 'E');
      const std::string_view digits = text.substr(digits_begin, j - digits_begin);
      if (!fraction &&
          (digits.size() > 20 || (digits.size() == 20 && digits > "18446744073709551615") ||
           (c == '-' && (digits.size() > 19 || (digits.size() == 19 && digits > "9223372036854775808"))))) {
        what = fmt::format("integer {} does not fit in 64 bits", printable(text.substr(i, j - i), 30));
        return i;
      }
      i = j - 1;
    }
  }
  return std::string_view::npos;
}

}  // namespace

std::string describe_json_error(std::string_view text, std::uint64_t base_offset, simdjson::error_code code) {
  if (const std::size_t bad = find_invalid_utf8(text); bad != std::string_view::npos) {
    return fmt::format("byte {}: invalid UTF-8 (byte 0x{:02x})", base_offset + bad,
                       static_cast<unsigned char>(text[bad]));
  }
  SyntaxProbe probe;
  nlohmann::json::sax_parse(text.begin(), text.end(), &probe, nlohmann::json::input_format_t::json, true);
  if (probe.failed) {
    const std::size_t at = probe.position > 0 ? probe.position - 1 : 0;
    return fmt::format("byte {}: {}", base_offset + at, printable(probe.message, 160));
  }
  std::string what;
  if (const std::size_t at = find_structural_limit(text, what); at != std::string_view::npos) {
    return fmt::format("byte {}: {}", base_offset + at, what);
  }
  return fmt::format("byte {}: {}", base_offset, simdjson::error_message(code));
}

simdjson::dom::element parse_json(simdjson::dom::parser& parser, std::string_view text, std::uint64_t base_offset) {
  simdjson::dom::element root;
  const simdjson::error_code code = parser.parse(text.data(), text.size(), false).get(root);
  if (code != simdjson::SUCCESS) throw InputError(describe_json_error(text, base_offset, code));
  refuse_duplicate_keys(root);
  return root;
}

}  // namespace remat::report
