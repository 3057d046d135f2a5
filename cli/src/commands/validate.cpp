// `remat-report validate`: a dump against its schema (built in, or --schema-dir) and its own
// cross-references; a snapshot in a file streams by (renderers/streamed_snapshot.hpp).

#include "commands/command.hpp"
#include "core/errors.hpp"
#include "core/terminal_text.hpp"
#include "output/json_text.hpp"
#include "reader/trace_file.hpp"
#include "renderers/renderer.hpp"
#include "renderers/streamed_snapshot.hpp"
#include "schema/schema_set.hpp"

#include <remat/budget/plan.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/predict.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>
#include <optional>

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

// Checks each line of a JSON Lines dump against the schema: the header against the kind's
// schema, every later line against its $defs/event.
class SchemaLines final : public LineInspector {
 public:
  SchemaLines(const SchemaSet& schemas, const std::string& schema, std::size_t max_errors,
              std::vector<std::string>& errors)
      : schemas_(schemas),
        header_schema_(schema),
        record_schema_(schema + "#/$defs/event"),
        max_errors_(max_errors),
        errors_(errors) {}

  bool inspect(simdjson::dom::element line, bool header, const std::string& where) override {
    std::vector<std::string> line_errors;
    schemas_.validate(header ? header_schema_ : record_schema_, line, JsonPath(), line_errors,
                      max_errors_ - errors_.size());
    for (const std::string& error : line_errors) errors_.push_back(where + ": " + error);
    return line_errors.empty();
  }
  void unparsable(const std::string& where, const std::string& problem) override {
    errors_.push_back(where + ": " + problem);
  }
  bool wants_more_lines() const override { return errors_.size() < max_errors_; }

 private:
  const SchemaSet& schemas_;
  std::string header_schema_, record_schema_;
  std::size_t max_errors_;
  std::vector<std::string>& errors_;
};

// A region profile or a plan as `advise`, Python and the runtime read it, a stage profile or a
// pipeline prediction as `predict` does: what the schema cannot say (each region once, totals
// that add up, a plan that agrees with itself, whole numbers written as such) by the readers
// themselves, so that validate accepts exactly what they do.
void check_read_dump(const DumpFile& dump, std::vector<std::string>& errors) {
  const bool region_profile = dump.kind == "region-profile", plan = dump.kind == "remat-plan";
  const bool stage_profile = dump.kind == "stage-profile", prediction = dump.kind == "pipeline-prediction";
  if (!region_profile && !plan && !stage_profile && !prediction) return;
  const std::string text = simdjson::minify(dump.root);
  try {
    if (region_profile) budget::profile_from_json(text, dump.path);
    if (plan) budget::plan_from_json(text, dump.path);
    if (stage_profile) pipeline::stage_profile_from_json(text, dump.path);
    if (prediction) pipeline::prediction_from_json(text, dump.path);
  } catch (const budget::BudgetError& error) {
    errors.push_back(error.what());
  } catch (const pipeline::PlanError& error) {
    errors.push_back(error.what());
  }
}

// A pipeline plan's indices, which no command reads back but validate: each entry's rank and stage
// among the plan's, its slots one per microbatch and within its ring; the counts written as whole
// numbers (the schema takes 1e308 for an integer).
void check_pipeline_plan(const DumpFile& dump, std::vector<std::string>& errors) {
  if (dump.kind != "pipeline-plan") return;
  const auto whole = [&](simdjson::dom::element value, const std::string& path) -> std::optional<std::uint64_t> {
    std::uint64_t n = 0;
    if (value.get(n) == simdjson::SUCCESS) return n;
    errors.push_back(fmt::format("{}: {}: must be a whole number of 0 or more written without a fraction or exponent",
                                 dump.path, path));
    return std::nullopt;
  };
  const auto count = [&](const char* key) { return whole(dump.root[key], std::string("$.") + key); };
  const auto ranks = count("ranks"), stages = count("stages"), microbatches = count("microbatches");
  if (!ranks || !stages || !microbatches) return;
  std::size_t i = 0;
  for (simdjson::dom::element entry : dump.root["entries"].get_array()) {
    const std::string at = fmt::format("$.entries[{}]", i++);
    const auto rank = whole(entry["rank"], at + ".rank"), stage = whole(entry["stage"], at + ".stage");
    if (rank && *rank >= *ranks) {
      errors.push_back(fmt::format("{}: {}.rank: {} is not one of the plan's {} ranks", dump.path, at, *rank, *ranks));
    }
    if (stage && *stage >= *stages) {
      errors.push_back(
          fmt::format("{}: {}.stage: {} is not one of the plan's {} stages", dump.path, at, *stage, *stages));
    }
    const simdjson::dom::array slots = entry["slots"].get_array();
    if (slots.size() != *microbatches) {
      errors.push_back(fmt::format("{}: {}.slots: {} slots for the plan's {} microbatches (one each)", dump.path, at,
                                   slots.size(), *microbatches));
    }
    std::uint64_t ring = 0;
    if (entry["ring_size"].get(ring) != simdjson::SUCCESS) continue;
    std::size_t m = 0;
    for (simdjson::dom::element slot : slots) {
      std::uint64_t index = 0;
      if (!slot.is_null() && slot.get(index) == simdjson::SUCCESS && index >= ring) {
        errors.push_back(
            fmt::format("{}: {}.slots[{}]: slot {} is outside the entry's ring of {}", dump.path, at, m, index, ring));
      }
      ++m;
    }
  }
}

// Schema problems first, then (when there are none) what the schema cannot say: tag and name
// indices, block layout, the consistency of the events, event counts. One pass over the
// input, so standard input works too.
std::vector<std::string> problems(const DumpFile& dump, const SchemaSet& schemas, const std::string& schema,
                                  std::size_t max_errors) {
  std::vector<std::string> errors;
  if (dump.json_lines) {
    SchemaLines lines(schemas, schema, max_errors, errors);
    DiscardEvents discard;
    try {
      TraceFile(dump, &lines).stream(discard);
      if (errors.empty()) renderer_for(dump);  // the schema version this build reads
    } catch (const InputError& error) {
      errors.push_back(error.what());
    }
    return errors;
  }
  schemas.validate(schema, dump.root, JsonPath(), errors, max_errors);
  for (std::string& error : errors) error = dump.path + ": " + error;
  if (errors.empty() && find_renderer(dump.kind) != nullptr) renderer_for(dump).check(dump);
  if (errors.empty()) check_read_dump(dump, errors);
  if (errors.empty()) check_pipeline_plan(dump, errors);
  return errors;
}

// The schema the dump's kind names; a --schema-dir lacking a schema this build has is the
// directory's fault, not the dump's.
void require_schema(const SchemaSet& schemas, const DumpFile& dump, const std::string& schema) {
  if (schemas.has(schema)) return;
  if (!schemas.directory().empty() && SchemaSet::load("").has(schema)) {
    throw SchemaError(
        fmt::format("--schema-dir {} holds no {}, the schema for '{}' dumps; copy it there from the "
                    "project's schemas/, or leave out --schema-dir to use the built-in schemas",
                    schemas.directory(), schema, printable(dump.kind)));
  }
  throw InputError(dump.path + ": $.kind",
                   fmt::format("no schema for dump kind '{}' (looked for {})", printable(dump.kind), schema));
}

// A snapshot in a file checked as it streams by: each segment and event against the schemas of its
// array's items, the rest of the document (those arrays empty) against the whole schema once the
// stream ends, and everything as read_snapshot checks it. Where all of that passes, so does a whole
// read (SchemaSet::element_schemas), and the snapshot's document comes back. Where anything fails,
// or the schemas cannot be applied a piece at a time, the dump comes back read whole, for
// `problems` to report as it reports any dump: the first problems in its order, --max-errors of them.
struct Opened {
  DumpFile dump;
  bool valid = false;
};

Opened open_checked(const std::string& file, const SchemaSet& schemas) {
  std::string schema;
  std::optional<std::vector<SchemaSet::Subschema>> each[2];
  // The stream stops at the first problem, and the snapshot is read whole.
  const auto refuse = [] { throw InputError("read whole to say what fails"); };
  StreamHooks hooks;
  hooks.on_array = [&](StreamedArray array, const DumpFile& so_far) {
    schema = so_far.kind + ".schema.json";
    if (!schemas.has(schema)) refuse();
    try {
      each[static_cast<int>(array)] = array == StreamedArray::segments
                                          ? schemas.element_schemas(schema, {"segments"})
                                          : schemas.element_schemas(schema, {"trace", "events"});
    } catch (const SchemaError&) {
      refuse();
    }
    if (!each[static_cast<int>(array)]) refuse();
  };
  hooks.on_element = [&](StreamedArray array, const JsonPath& path, simdjson::dom::element value) {
    std::vector<std::string> errors;
    try {
      schemas.validate(*each[static_cast<int>(array)], value, path, errors, 1);
    } catch (const SchemaError&) {
      refuse();
    }
    if (!errors.empty()) refuse();
  };
  DiscardEvents discard;
  SnapshotInput input = open_streaming(
      file, [&](const TagTable&) -> EventSink& { return discard; }, {}, hooks);
  if (!input.streamed) return {std::move(input.file), false};
  std::vector<std::string> errors;
  try {
    schemas.validate(schema, input.file.root, JsonPath(), errors, 1);
  } catch (const SchemaError&) {
    errors.emplace_back();  // for a whole read to tell
  }
  if (!errors.empty()) return {open_dump(file), false};
  return {std::move(input.file), true};
}

void run_validate(const ValidateOptions& opts, const GlobalOptions& options) {
  const OutputFormat format = options.format();
  const SchemaSet schemas = SchemaSet::load(opts.schema_dir);
  std::vector<std::string> errors;
  std::string name = opts.file;
  std::string kind;
  std::int64_t version = 0;
  std::string schema;
  try {
    const Opened opened = open_checked(opts.file, schemas);
    const DumpFile& dump = opened.dump;
    name = dump.path;
    kind = dump.kind;
    version = dump.schema_version;
    schema = dump.kind + ".schema.json";
    if (!opened.valid) {
      require_schema(schemas, dump, schema);
      std::vector<std::string> found = problems(dump, schemas, schema, opts.max_errors);
      errors.insert(errors.end(), found.begin(), found.end());
    }
  } catch (const InputError& error) {
    errors.push_back(error.what());
  }
  if (format == OutputFormat::json) {
    nlohmann::ordered_json result = {{"file", name},     {"valid", errors.empty()},
                                     {"kind", kind},     {"schema_version", version},
                                     {"schema", schema}, {"errors", errors}};
    std::cout << json_text(result, 2) << '\n';
  } else if (errors.empty()) {
    std::cout << escape_controls(fmt::format("{}: valid {} dump (schema_version {}, {})", name, kind, version, schema))
              << '\n';
  } else {
    for (const std::string& error : errors) std::cerr << "invalid: " << escape_controls(error) << '\n';
  }
  std::cout.flush();
  if (!errors.empty()) throw Invalid("");
}

}  // namespace

void register_validate(CLI::App& app, GlobalOptions& options) {
  auto* command =
      app.add_subcommand("validate", "Check a dump against its schema in schemas/ and its internal references");
  auto opts = std::make_shared<ValidateOptions>();
  command->add_option("file", opts->file, "A remat dump")->required();
  command->add_option("--schema-dir", opts->schema_dir,
                      "Read schemas from this directory instead of the built-in copy");
  command->add_option("--max-errors", opts->max_errors, "Stop after N problems")
      ->check(whole_number(1, 100000, "problems to report at most"));
  add_output_options(*command, options);
  command->callback([opts, &options] {
    try {
      run_validate(*opts, options);
    } catch (const SchemaError& error) {
      throw InputError(error.what());  // the schema is at fault, not the dump: no "invalid:" verdict
    }
  });
}

}  // namespace remat::report
