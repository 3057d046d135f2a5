#pragma once
// Whole-document JSON parsing with errors that name the byte offset of the problem, refusing
// objects with a duplicated key (reader/duplicate_keys.hpp).

#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::report {

// Parses `text` (which must be followed by simdjson::SIMDJSON_PADDING readable bytes) as one
// JSON document. On failure throws InputError "byte N: <problem>", with N counted from
// `base_offset` so errors inside a line of a larger file point into that file; a duplicated
// key is an InputError naming its JSON path.
simdjson::dom::element parse_json(simdjson::dom::parser& parser, std::string_view text, std::uint64_t base_offset = 0);

// Where and why `text` is not valid JSON: "byte N: <problem>". Slow; for the error path only.
std::string describe_json_error(std::string_view text, std::uint64_t base_offset, simdjson::error_code code);

// Offset of the first byte that is not valid UTF-8, or npos.
std::size_t find_invalid_utf8(std::string_view text);

}  // namespace remat::report
