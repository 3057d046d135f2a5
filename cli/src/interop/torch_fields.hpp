#pragma once
// Reading the dicts of a PyTorch memory-snapshot pickle: each field checked for its type and
// range, and every error naming the field's path in the pickle ("$['segments'][2]['size']").

#include "interop/pickle_reader.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace remat::report::torch_fields {

[[noreturn]] void bad(const std::string& where, const std::string& what);
std::string key_path(const std::string& where, std::string_view key);
// A signed field (time_us, device): Python ints from 2^63 up do not fit. Missing or None:
// `fallback`, or an error without one.
std::int64_t integer_at(const PyValue& dict, std::string_view key, const std::string& where,
                        std::optional<std::int64_t> fallback = std::nullopt);
// An unsigned field (addresses, sizes, streams): 0 to 2^64 - 1.
std::uint64_t size_at(const PyValue& dict, std::string_view key, const std::string& where,
                      std::optional<std::uint64_t> fallback = std::nullopt);
// A string field, or `fallback` where it is missing or not a string.
std::string string_at(const PyValue& dict, std::string_view key, const std::string& fallback);
// `value` where it is a list or tuple; an error naming `where` otherwise.
const PyValue& list_at(const PyValue& value, const std::string& where);

}  // namespace remat::report::torch_fields
