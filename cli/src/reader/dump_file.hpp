#pragma once
// Opening a dump: looks at its first bytes (reader/input_sniff.hpp), reads its `kind` and
// `schema_version`, and either parses it as one JSON document or, for the kinds written as
// JSON Lines (a header line, then one record a line), keeps the header and a reader
// positioned after it so the records stream by in bounded memory. Files, `-` (standard
// input), pipes and FIFOs are all read front to back once.

#include "model/dump.hpp"
#include "reader/line_reader.hpp"

#include <simdjson.h>

#include <memory>
#include <string>

namespace remat::report {

struct DumpFile {
  std::string path;  // what messages call the input: its path, or "<stdin>"
  std::string kind;
  std::int64_t schema_version = 0;
  bool json_lines = false;

  // Single-document dumps: the parsed document, alive as long as this object.
  std::unique_ptr<simdjson::dom::parser> parser;
  simdjson::dom::element root;

  // JSON Lines dumps: the header line, and the rest of the input, which one reader takes
  // (TraceFile); a second one is refused.
  simdjson::padded_string header_line;
  mutable std::unique_ptr<LineReader> lines;
};

// Kinds written as JSON Lines.
bool is_json_lines_kind(std::string_view kind);

// The kind a dump names, as remat-report reads it: kinds are kebab-case ("stage-profile");
// dumps written before that spell stage_profile, pipeline_prediction, prediction_check,
// region_profile and remat_plan with underscores, and are read as the same kinds.
std::string canonical_kind(std::string_view kind);

// Opens `argument` (a path, or `-` for standard input). Throws InputError for an unreadable,
// empty, non-JSON or kind-less input, naming the input and the byte, line or JSON path.
DumpFile open_dump(const std::string& argument);
// The same for an input already open, whose first bytes a caller may have peeked at.
DumpFile open_dump(std::unique_ptr<LineReader> lines, std::unique_ptr<simdjson::dom::parser> parser = nullptr);
// A single-document dump held in memory (what `import` makes of a pickle), named `name`.
DumpFile dump_from_text(const std::string& text, const std::string& name);

}  // namespace remat::report
