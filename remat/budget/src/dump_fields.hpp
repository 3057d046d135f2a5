#pragma once
// Reading a budget dump's fields, each checked: a field missing or of the wrong type is a
// BudgetError naming the source, the field's JSON path and what it must be.

#include <remat/budget/error.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

namespace remat::budget::detail {

using Json = nlohmann::ordered_json;

[[noreturn]] inline void refuse(std::string_view source, const std::string& path, const std::string& problem) {
  throw BudgetError(std::string(source) + ": " + path + ": " + problem);
}

inline const Json& member(const Json& object, const char* key, std::string_view source, const std::string& path) {
  const auto it = object.find(key);
  if (it == object.end()) refuse(source, path, std::string("has no '") + key + "'");
  return *it;
}

inline std::uint64_t count_of(const Json& value, std::string_view source, const std::string& path) {
  if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<std::int64_t>() >= 0)) {
    refuse(source, path, "must be a whole number of 0 or more, got " + value.dump());
  }
  return value.get<std::uint64_t>();
}

inline double seconds_of(const Json& value, std::string_view source, const std::string& path) {
  if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
    refuse(source, path, "must be a number of seconds, 0 or more, got " + value.dump());
  }
  return value.get<double>();
}

inline std::string text_of(const Json& value, std::string_view source, const std::string& path) {
  if (!value.is_string()) refuse(source, path, "must be a string, got " + value.dump());
  return value.get<std::string>();
}

}  // namespace remat::budget::detail
