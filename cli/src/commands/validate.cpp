#include "commands/command.hpp"
#include "core/errors.hpp"
#include "reader/json_document.hpp"
#include "reader/line_reader.hpp"
#include "renderers/renderer.hpp"
#include "schema/schema_set.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>

namespace remat::report {

namespace {

struct ValidateOptions {
  std::string file;
  std::string schema_dir;
  std::size_t max_errors = 20;
};

// Thrown to end `validate` with exit code 2 after the problems were printed.
class Invalid : public InputError {
 public:
  using InputError::InputError;
};

std::vector<std::string> schema_errors(const DumpFile& dump, const SchemaSet& schemas, const std::string& schema,
                                       std::size_t max_errors) {
  std::vector<std::string> errors;
  if (!dump.json_lines) {
    schemas.validate(schema, dump.root, JsonPath(), errors, max_errors);
    for (std::string& error : errors) error = dump.path + ": " + error;
    return errors;
  }
  // JSON Lines: the header against the schema, every later line against its $defs/record.
  const std::string record = schema + "#/$defs/event";
  LineReader lines(dump.path);
  simdjson::dom::parser parser;
  std::string_view line;
  while (errors.size() < max_errors && lines.next(line)) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{}: line {} (byte {})", dump.path, lines.line_number(), lines.line_offset());
    simdjson::dom::element value;
    try {
      value = parse_json(parser, line, lines.line_offset());
    } catch (const InputError& error) {
      errors.push_back(where + ": " + error.what());
      continue;
    }
    std::vector<std::string> line_errors;
    schemas.validate(lines.line_number() == 1 ? schema : record, value, JsonPath(), line_errors,
                     max_errors - errors.size());
    for (const std::string& error : line_errors) errors.push_back(where + ": " + error);
  }
  return errors;
}

}  // namespace

void register_validate(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("validate", "Check a dump against its schema in schemas/ and its internal references");
  auto opts = std::make_shared<ValidateOptions>();
  command->add_option("file", opts->file, "A remat dump")->required();
  command->add_option("--schema-dir", opts->schema_dir, "Read schemas from this directory instead of the built-in copy");
  command->add_option("--max-errors", opts->max_errors, "Stop after N problems")->check(CLI::Range(1, 100000));
  add_output_options(*command, options);
  command->callback([opts, &options] {
    const OutputFormat format = options.format();
    const SchemaSet schemas = SchemaSet::load(opts->schema_dir);
    std::vector<std::string> errors;
    std::string kind;
    std::int64_t version = 0;
    std::string schema;
    try {
      const DumpFile dump = open_dump(opts->file);
      kind = dump.kind;
      version = dump.schema_version;
      schema = dump.kind + ".schema.json";
      if (!schemas.has(schema)) {
        throw InputError(opts->file + ": $.kind", fmt::format("no schema for dump kind '{}' (looked for {})",
                                                              printable(dump.kind), schema));
      }
      errors = schema_errors(dump, schemas, schema, opts->max_errors);
      // Beyond the schema: tag and name indices, block layout, time order, event counts.
      if (errors.empty() && find_renderer(dump.kind) != nullptr) renderer_for(dump).check(dump);
    } catch (const InputError& error) {
      errors.push_back(error.what());
    }
    if (format == OutputFormat::json) {
      nlohmann::ordered_json result = {{"file", opts->file}, {"valid", errors.empty()}, {"kind", kind},
                                       {"schema_version", version}, {"schema", schema}, {"errors", errors}};
      std::cout << result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    } else if (errors.empty()) {
      std::cout << fmt::format("{}: valid {} dump (schema_version {}, {})\n", opts->file, kind, version, schema);
    } else {
      for (const std::string& error : errors) std::cerr << "invalid: " << error << '\n';
    }
    if (!errors.empty()) throw Invalid("");
  });
}

}  // namespace remat::report
