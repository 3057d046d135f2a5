#include "reader/json_fields.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

#include <cmath>

namespace remat::report::json {

using simdjson::dom::element_type;

std::string_view type_name(element value) {
  switch (value.type()) {
    case element_type::ARRAY: return "an array";
    case element_type::OBJECT: return "an object";
    case element_type::INT64:
    case element_type::UINT64: return "an integer";
    case element_type::DOUBLE: return "a number with a fraction";
    case element_type::STRING: return "a string";
    case element_type::BOOL: return "a boolean";
    case element_type::NULL_VALUE: return "null";
  }
  return "an unknown value";
}

std::string show_double(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
  return text;
}

namespace {
[[noreturn]] void wrong_type(element value, const JsonPath& path, std::string_view expected) {
  throw InputError(path.str(), fmt::format("expected {}, found {}", expected, type_name(value)));
}

// A number written with a fraction or an exponent where an integer in [lowest, past_highest) is
// expected; a whole number in range says how to write it.
[[noreturn]] void not_an_integer(double value, const JsonPath& path, std::string_view expected, double lowest,
                                 double past_highest) {
  const std::string found = show_double(value);
  if (value == std::trunc(value) && value >= lowest && value < past_highest) {
    throw InputError(path.str(), fmt::format("expected {}, found {}, a whole number written with a fraction or an "
                                             "exponent; write it as the integer {:.0f}",
                                             expected, found, value));
  }
  throw InputError(path.str(), fmt::format("expected {}, found {}", expected, found));
}

constexpr double kTwoTo63 = 9223372036854775808.0;
}  // namespace

object as_object(element value, const JsonPath& path) {
  if (value.type() != element_type::OBJECT) wrong_type(value, path, "an object");
  return object(value);
}

array as_array(element value, const JsonPath& path) {
  if (value.type() != element_type::ARRAY) wrong_type(value, path, "an array");
  return array(value);
}

std::string_view as_string(element value, const JsonPath& path) {
  if (value.type() != element_type::STRING) wrong_type(value, path, "a string");
  return std::string_view(value);
}

std::uint64_t as_u64(element value, const JsonPath& path) {
  switch (value.type()) {
    case element_type::UINT64: return std::uint64_t(value);
    case element_type::INT64: {
      const std::int64_t v = std::int64_t(value);
      if (v < 0) throw InputError(path.str(), fmt::format("must not be negative (got {})", v));
      return static_cast<std::uint64_t>(v);
    }
    case element_type::DOUBLE: not_an_integer(double(value), path, "a non-negative integer", 0.0, 2 * kTwoTo63);
    default: wrong_type(value, path, "a non-negative integer");
  }
}

std::int64_t as_i64(element value, const JsonPath& path) {
  switch (value.type()) {
    case element_type::INT64: return std::int64_t(value);
    case element_type::UINT64:
      throw InputError(path.str(), fmt::format("integer {} overflows a signed 64-bit value", std::uint64_t(value)));
    case element_type::DOUBLE: not_an_integer(double(value), path, "an integer", -kTwoTo63, kTwoTo63);
    default: wrong_type(value, path, "an integer");
  }
}

double as_number(element value, const JsonPath& path) {
  switch (value.type()) {
    case element_type::INT64: return static_cast<double>(std::int64_t(value));
    case element_type::UINT64: return static_cast<double>(std::uint64_t(value));
    case element_type::DOUBLE: return double(value);
    default: wrong_type(value, path, "a number");
  }
}

bool as_bool(element value, const JsonPath& path) {
  if (value.type() != element_type::BOOL) wrong_type(value, path, "a boolean");
  return bool(value);
}

bool is_null(element value) { return value.type() == element_type::NULL_VALUE; }

element member(object parent, std::string_view key, const JsonPath& parent_path) {
  element value;
  if (parent.at_key(key).get(value) != simdjson::SUCCESS) {
    throw InputError(parent_path.key(key).str(), "missing required field");
  }
  return value;
}

std::optional<element> optional_member(object parent, std::string_view key) {
  element value;
  if (parent.at_key(key).get(value) != simdjson::SUCCESS) return std::nullopt;
  return value;
}

std::uint32_t as_index(element value, const JsonPath& path, std::size_t limit, std::string_view table) {
  const std::uint64_t index = as_u64(value, path);
  if (index >= limit) {
    throw InputError(path.str(), fmt::format("index {} is out of range; `{}` has {} entries", index, table, limit));
  }
  return static_cast<std::uint32_t>(index);
}

std::uint64_t u64_field(object parent, std::string_view key, const JsonPath& path) {
  return as_u64(member(parent, key, path), path.key(key));
}

std::int64_t i64_field(object parent, std::string_view key, const JsonPath& path) {
  return as_i64(member(parent, key, path), path.key(key));
}

std::string_view string_field(object parent, std::string_view key, const JsonPath& path) {
  return as_string(member(parent, key, path), path.key(key));
}

}  // namespace remat::report::json
