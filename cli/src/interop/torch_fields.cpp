#include "interop/torch_fields.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

#include <cstdint>

namespace remat::report::torch_fields {

using Kind = PyValue::Kind;

[[noreturn]] void bad(const std::string& where, const std::string& what) { throw InputError(where, what); }

std::string key_path(const std::string& where, std::string_view key) { return where + "['" + std::string(key) + "']"; }

namespace {

// The int under `key`, or null when it is missing or None.
const PyValue* int_value(const PyValue& dict, std::string_view key, const std::string& where, bool has_fallback) {
  const PyValue* v = dict.get(key);
  if (v == nullptr || v->kind == Kind::none) {
    if (has_fallback) return nullptr;
    bad(where, fmt::format("missing key '{}'", key));
  }
  if (v->kind != Kind::integer) bad(key_path(where, key), "expected an int");
  return v;
}

}  // namespace

std::int64_t integer_at(const PyValue& dict, std::string_view key, const std::string& where,
                        std::optional<std::int64_t> fallback) {
  const PyValue* v = int_value(dict, key, where, fallback.has_value());
  if (v == nullptr) return *fallback;
  if (v->above_int64) {
    bad(key_path(where, key), fmt::format("{} does not fit a signed 64-bit integer (at most 2^63 - 1 = {})",
                                          v->unsigned_integer(), INT64_MAX));
  }
  return v->integer;
}

std::uint64_t size_at(const PyValue& dict, std::string_view key, const std::string& where,
                      std::optional<std::uint64_t> fallback) {
  const PyValue* v = int_value(dict, key, where, fallback.has_value());
  if (v == nullptr) return *fallback;
  if (!v->above_int64 && v->integer < 0) {
    bad(key_path(where, key), fmt::format("must not be negative (got {})", v->integer));
  }
  return v->unsigned_integer();
}

std::string string_at(const PyValue& dict, std::string_view key, const std::string& fallback) {
  const PyValue* v = dict.get(key);
  return v != nullptr && v->kind == Kind::string ? v->text : fallback;
}

const PyValue& list_at(const PyValue& value, const std::string& where) {
  if (value.kind != Kind::list && value.kind != Kind::tuple) bad(where, "expected a list");
  return value;
}

}  // namespace remat::report::torch_fields
