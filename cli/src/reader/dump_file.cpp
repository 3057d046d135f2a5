#include "reader/dump_file.hpp"

#include "core/errors.hpp"
#include "reader/duplicate_keys.hpp"
#include "reader/input_sniff.hpp"
#include "reader/json_document.hpp"
#include "reader/json_fields.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace remat::report {

std::string canonical_kind(std::string_view kind) {
  static constexpr std::string_view kUnderscored[] = {"stage_profile", "pipeline_prediction", "prediction_check",
                                                      "region_profile", "remat_plan"};
  std::string canonical(kind);
  if (std::find(std::begin(kUnderscored), std::end(kUnderscored), kind) != std::end(kUnderscored)) {
    std::replace(canonical.begin(), canonical.end(), '_', '-');
  }
  return canonical;
}

namespace {

// The first read; the buffer grows only for a longer first line.
constexpr std::size_t kFirstChunk = std::size_t{1} << 16;

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

void read_kind(DumpFile& dump, simdjson::dom::element root) {
  const JsonPath path;
  const json::object object = json::as_object(root, path);
  const json::element kind = json::member(object, "kind", path);
  dump.kind = canonical_kind(json::as_string(kind, path.key("kind")));
  dump.schema_version = json::i64_field(object, "schema_version", path);
}

// Runs `step`, prefixing the input's name to the InputError it throws.
template <typename Step>
auto naming(const DumpFile& dump, Step step) {
  try {
    return step();
  } catch (const InputError& error) {
    throw InputError(dump.path, error.what());
  }
}

}  // namespace

bool is_json_lines_kind(std::string_view kind) { return kind == "trace"; }

DumpFile open_dump(const std::string& argument) {
  return open_dump(std::make_unique<LineReader>(InputFile::open(argument), kFirstChunk));
}

DumpFile dump_from_text(const std::string& text, const std::string& name) {
  DumpFile dump;
  dump.path = name;
  dump.parser = std::make_unique<simdjson::dom::parser>();
  const simdjson::padded_string padded(text);
  naming(dump, [&] {
    dump.root = parse_json(*dump.parser, padded, 0);
    read_kind(dump, dump.root);
  });
  return dump;
}

DumpFile open_dump(std::unique_ptr<LineReader> lines, std::unique_ptr<simdjson::dom::parser> parser) {
  DumpFile dump;
  dump.path = lines->name();
  dump.parser = parser ? std::move(parser) : std::make_unique<simdjson::dom::parser>();
  refuse_non_json_start(lines->peek(kSniffBytes), dump.path);
  if (!lines->skip_whitespace()) throw InputError(dump.path, std::string(kOnlyWhitespace));
  refuse_non_object_start(lines->peek(1)[0], lines->position(), dump.path);

  // A complete object on the first line is a header line or a one-line document; anything
  // else (a pretty-printed document, a syntax error) is parsed as one document.
  std::string_view first;
  lines->next(first);
  simdjson::dom::element root;
  if (dump.parser->parse(first.data(), first.size(), false).get(root) == simdjson::SUCCESS &&
      root.type() == simdjson::dom::element_type::OBJECT) {
    naming(dump, [&] {
      refuse_duplicate_keys(root);
      read_kind(dump, root);
    });
    if (is_json_lines_kind(dump.kind)) {
      dump.json_lines = true;
      dump.header_line = simdjson::padded_string(first);
      dump.lines = std::move(lines);
      return dump;
    }
    std::string_view more;
    while (lines->next(more)) {
      if (is_blank(more)) continue;
      throw InputError(fmt::format("{}: line {} (byte {})", dump.path, lines->line_number(), lines->line_offset()),
                       fmt::format("a {} dump is one JSON document, but this file has more lines after its first (is "
                                   "it a trace written with the wrong kind?)",
                                   printable(dump.kind)));
    }
    dump.root = root;
    return dump;
  }
  lines->unread();
  const std::string_view text = lines->read_rest();
  naming(dump, [&] {
    dump.root = parse_json(*dump.parser, text, lines->line_offset());
    read_kind(dump, dump.root);
  });
  if (is_json_lines_kind(dump.kind)) {
    throw InputError(dump.path, fmt::format("a {} dump is JSON Lines: its header object on the first line, then one "
                                            "record a line; this file's first line is not a complete JSON object",
                                            dump.kind));
  }
  return dump;
}

}  // namespace remat::report
