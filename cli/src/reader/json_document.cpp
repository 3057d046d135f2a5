#include "reader/json_document.hpp"

#include "core/errors.hpp"
#include "reader/duplicate_keys.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <deque>
#include <new>
#include <optional>
#include <vector>

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

// nlohmann's exception id for a number that overflows a double: out_of_range.406, "number
// overflow parsing '1e400'".
constexpr int kNumberOverflow = 406;

// Accepts everything and records the first syntax error and where in the document it is;
// builds no document.
struct SyntaxProbe {
  // An object or array the parser is inside: its last key, or how many elements it has had.
  struct Frame {
    bool array = false;
    std::size_t elements = 0;
    std::string key;
  };

  std::size_t position = 0;
  std::string message;
  std::string token;  // the text the parser stopped at
  bool number_overflow = false;
  bool failed = false;
  std::vector<Frame> frames;

  bool null() { return value_done(); }
  bool boolean(bool) { return value_done(); }
  bool number_integer(std::int64_t) { return value_done(); }
  bool number_unsigned(std::uint64_t) { return value_done(); }
  bool number_float(double, const std::string&) { return value_done(); }
  bool string(std::string&) { return value_done(); }
  bool binary(nlohmann::json::binary_t&) { return value_done(); }
  bool start_object(std::size_t) { return opened(false); }
  bool key(std::string& name) {
    frames.back().key = name;
    return true;
  }
  bool end_object() { return closed(); }
  bool start_array(std::size_t) { return opened(true); }
  bool end_array() { return closed(); }
  bool parse_error(std::size_t pos, const std::string& last_token, const nlohmann::json::exception& error) {
    failed = true;
    position = pos;
    token = last_token;
    number_overflow = error.id == kNumberOverflow;
    message = error.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
    if (const auto colon = message.find(": "); colon != std::string::npos) message = message.substr(colon + 2);
    return false;
  }

  // The JSON path of the value the parser is at, below `base`.
  std::string path(const JsonPath& base) const {
    std::deque<JsonPath> chain{base};  // a deque keeps each parent's address
    for (const Frame& frame : frames) {
      chain.push_back(frame.array ? chain.back().index(frame.elements) : chain.back().key(frame.key));
    }
    return chain.back().str();
  }

 private:
  bool value_done() {
    if (!frames.empty() && frames.back().array) ++frames.back().elements;
    return true;
  }
  bool opened(bool array) {
    frames.push_back(Frame{.array = array});
    return true;
  }
  bool closed() {
    frames.pop_back();
    return value_done();
  }
};

// Structural problems nlohmann accepts but simdjson rejects: nesting depth (`depth` levels
// enclosing `text`) and integers that fit no 64-bit type. Returns the offset or npos.
std::size_t find_structural_limit(std::string_view text, std::string& what, std::size_t depth) {
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

// Invalid UTF-8, or the first syntax error: "byte N: <problem>"; a number too large for a double
// only where `number_overflow` is to be told.
std::optional<std::string> find_syntax_error(std::string_view text, std::uint64_t base_offset, const JsonPath& path,
                                             bool number_overflow = true) {
  if (const std::size_t bad = find_invalid_utf8(text); bad != std::string_view::npos) {
    return fmt::format("byte {}: invalid UTF-8 (byte 0x{:02x})", base_offset + bad,
                       static_cast<unsigned char>(text[bad]));
  }
  SyntaxProbe probe;
  nlohmann::json::sax_parse(text.begin(), text.end(), &probe, nlohmann::json::input_format_t::json, true);
  if (probe.failed && probe.number_overflow) {
    if (!number_overflow) return std::nullopt;
    const std::size_t at = probe.position > probe.token.size() ? probe.position - probe.token.size() : 0;
    return fmt::format(
        "byte {}: {}: the number {} is too large for a 64-bit floating-point value (at most about "
        "1.8e308); sizes, counts and times are integers of at most 18446744073709551615",
        base_offset + at, probe.path(path), printable(probe.token, 30));
  }
  if (probe.failed) {
    const std::size_t at = probe.position > 0 ? probe.position - 1 : 0;
    if (probe.position >= text.size() && !probe.frames.empty()) {
      // The parser ran out of input inside an object or array: the document's end is missing.
      return fmt::format("byte {}: the input ends inside {}: the file is cut short (a job killed mid-write?)",
                         base_offset + text.size(), probe.path(path));
    }
    return fmt::format("byte {}: {}", base_offset + at, printable(probe.message, 160));
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> find_json_syntax_error(std::string_view text) {
  return find_syntax_error(text, 0, JsonPath(), /*number_overflow=*/false);
}

std::string describe_json_error(std::string_view text, std::uint64_t base_offset, simdjson::error_code code,
                                const JsonPath& path, std::size_t depth) {
  if (std::optional<std::string> syntax = find_syntax_error(text, base_offset, path)) return *syntax;
  std::string what;
  if (const std::size_t at = find_structural_limit(text, what, depth); at != std::string_view::npos) {
    return fmt::format("byte {}: {}", base_offset + at, what);
  }
  return fmt::format("byte {}: {}", base_offset, simdjson::error_message(code));
}

simdjson::dom::element parse_json(simdjson::dom::parser& parser, std::string_view text, std::uint64_t base_offset,
                                  const JsonPath& path, std::size_t depth) {
  simdjson::dom::element root;
  const simdjson::error_code code = parser.parse(text.data(), text.size(), false).get(root);
  if (code != simdjson::SUCCESS) throw InputError(describe_json_error(text, base_offset, code, path, depth));
  refuse_duplicate_keys(root, path);
  return root;
}

simdjson::dom::parser nested_value_parser(std::size_t depth) {
  simdjson::dom::parser parser;
  // The capacity grows as values need it, keeping the depth.
  if (parser.allocate(simdjson::dom::MINIMAL_DOCUMENT_CAPACITY, simdjson::DEFAULT_MAX_DEPTH - depth) !=
      simdjson::SUCCESS) {
    throw std::bad_alloc();
  }
  return parser;
}

}  // namespace remat::report
