#pragma once
// Typed access to a parsed JSON value; every failure is an InputError naming the JSON path
// and what was expected, e.g. `$.segments[2].size: must not be negative (got -4)`.

#include "reader/json_path.hpp"

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace remat::report::json {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

object as_object(element value, const JsonPath& path);
array as_array(element value, const JsonPath& path);
std::string_view as_string(element value, const JsonPath& path);
std::uint64_t as_u64(element value, const JsonPath& path);
std::int64_t as_i64(element value, const JsonPath& path);
double as_number(element value, const JsonPath& path);
bool as_bool(element value, const JsonPath& path);
bool is_null(element value);

// The member `key` of `parent`; a missing member is an error naming the path.
element member(object parent, std::string_view key, const JsonPath& parent_path);
std::optional<element> optional_member(object parent, std::string_view key);

// An index into a table of `limit` entries (names, tags).
std::uint32_t as_index(element value, const JsonPath& path, std::size_t limit, std::string_view table);

// The member `key` of `parent` (at `path`) read as its type: member() then as_*().
std::uint64_t u64_field(object parent, std::string_view key, const JsonPath& path);
std::int64_t i64_field(object parent, std::string_view key, const JsonPath& path);
std::string_view string_field(object parent, std::string_view key, const JsonPath& path);

std::string_view type_name(element value);

// A number read as a double, as messages quote it: as short as reads back the same, with ".0"
// on a whole number ("1.0", not the "1" fmt writes, which reads as the integer it is not).
std::string show_double(double value);

}  // namespace remat::report::json
