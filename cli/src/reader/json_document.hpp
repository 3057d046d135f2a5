#pragma once
// Whole-document JSON parsing with errors that name the byte offset of the problem, refusing
// objects with a duplicated key (reader/duplicate_keys.hpp).

#include "reader/json_path.hpp"

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace remat::report {

// Parses `text` (which must be followed by simdjson::SIMDJSON_PADDING readable bytes) as one
// JSON document. On failure throws InputError "byte N: <problem>", with N counted from
// `base_offset` so errors inside a line of a larger file point into that file; a duplicated
// key, or a number too large for a double, is an InputError naming its JSON path, `path` being
// where `text` sits in the dump (the root unless `text` is one value of a larger document).
// `depth` is how many objects and arrays enclose `text` in its document, for the message when it
// nests too deep (see nested_value_parser).
simdjson::dom::element parse_json(simdjson::dom::parser& parser, std::string_view text, std::uint64_t base_offset = 0,
                                  const JsonPath& path = JsonPath(), std::size_t depth = 0);

// A parser for values that sit `depth` objects and arrays deep in a document, parsed alone: it
// refuses the nesting a parser of the whole document refuses (simdjson::DEFAULT_MAX_DEPTH levels
// in all).
simdjson::dom::parser nested_value_parser(std::size_t depth);

// Where and why `text` is not valid JSON: "byte N: <problem>", or "byte N: $.path: <problem>" for
// a number too large for a double. Slow; for the error path only.
std::string describe_json_error(std::string_view text, std::uint64_t base_offset, simdjson::error_code code,
                                const JsonPath& path = JsonPath(), std::size_t depth = 0);

// Where and why `text` is not JSON as describe_json_error says it ("byte N: the input ends inside
// $.regions[3]: the file is cut short ..."), or empty when its syntax is sound: for a document
// another parser reads, so that its syntax errors read as every dump's do. A number too large for
// a double is left to that parser, which names its field.
std::optional<std::string> find_json_syntax_error(std::string_view text);

// Offset of the first byte that is not valid UTF-8, or npos.
std::size_t find_invalid_utf8(std::string_view text);

}  // namespace remat::report
