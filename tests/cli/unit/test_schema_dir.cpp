// `validate --schema-dir` reads schema files anyone can write: a schema that cannot be used
// (a reference cycle, an invalid pattern, a missing file) exits 2 naming the schema file and
// the problem, never crashes, and is never blamed on the dump.
#include "cli_runner.hpp"
#include "schema/schema_set.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>

namespace remat::report::testing {
namespace {

// A copy of the project's schemas in `dir`/schemas, snapshot.schema.json changed by `edit`.
template <typename Edit>
std::string schema_dir_with(const TempDir& dir, Edit edit) {
  const std::filesystem::path schemas = dir.path("schemas");
  std::filesystem::create_directories(schemas);
  for (const auto& [file, text] : embedded_schemas()) {
    nlohmann::json schema = nlohmann::json::parse(text);
    if (file == "snapshot.schema.json") edit(schema);
    dir.write("schemas/" + std::string(file), schema.dump());
  }
  return schemas.string();
}

CliResult validate_snapshot(const std::string& schemas, const std::string& snapshot = data_path("snapshot-end.json")) {
  return run({"validate", snapshot, "--schema-dir", schemas});
}

TEST(SchemaDir, TheProjectsOwnSchemasValidateTheFixtures) {
  TempDir dir;
  const std::string schemas = schema_dir_with(dir, [](nlohmann::json&) {});
  for (const char* fixture : {"snapshot-end.json", "trace.jsonl", "oom.json", "pipeline-plan.json"}) {
    const CliResult r = run({"validate", data_path(fixture), "--schema-dir", schemas});
    EXPECT_EQ(r.code, 0) << fixture << ": " << r.err;
  }
}

TEST(SchemaDir, ASchemaReferringToItselfIsAReferenceCycleNotACrash) {
  TempDir dir;
  const std::string schemas = schema_dir_with(dir, [](nlohmann::json& schema) { schema = {{"$ref", "#"}}; });
  const CliResult r = validate_snapshot(schemas);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: " + schemas +
                       "/snapshot.schema.json: '$ref' '#' is part of a reference cycle: more than 64 references in a "
                       "row never reach a schema that checks the value; make the chain end\n");
}

TEST(SchemaDir, DefinitionsReferringToEachOtherAreAReferenceCycle) {
  TempDir dir;
  const std::string schemas = schema_dir_with(dir, [](nlohmann::json& schema) {
    schema["$defs"]["a"] = {{"$ref", "#/$defs/b"}};
    schema["$defs"]["b"] = {{"$ref", "#/$defs/a"}};
    schema["properties"]["host"] = {{"$ref", "#/$defs/a"}};
  });
  const CliResult r = validate_snapshot(schemas);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(schemas + "/snapshot.schema.json: '$ref' '#/$defs/"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is part of a reference cycle"), std::string::npos) << r.err;
}

TEST(SchemaDir, AOneOfThatLeadsBackToItselfIsAReferenceCycle) {
  TempDir dir;
  const std::string schemas =
      schema_dir_with(dir, [](nlohmann::json& schema) { schema = {{"oneOf", {{{"$ref", "#"}}}}}; });
  const CliResult r = validate_snapshot(schemas);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/snapshot.schema.json: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reference cycle"), std::string::npos) << r.err;
}

TEST(SchemaDir, AnInvalidPatternNamesTheSchemaAndThePattern) {
  TempDir dir;
  const std::string schemas =
      schema_dir_with(dir, [](nlohmann::json& schema) { schema["properties"]["created_at"]["pattern"] = "("; });
  const CliResult r = validate_snapshot(schemas);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("remat-report: " + schemas + "/snapshot.schema.json: pattern '(' is not a valid regular "
                                                     "expression (",
                        0),
            0u)
      << r.err;
  EXPECT_NE(r.err.find("); write it in ECMAScript syntax\n"), std::string::npos) << r.err;
}

TEST(SchemaDir, AValueTooLongForThePatternCheckIsReportedNotMatched) {
  TempDir dir;
  const std::string schemas = schema_dir_with(
      dir, [](nlohmann::json& schema) { schema["properties"]["host"] = {{"type", "string"}, {"pattern", "^(a|b)*$"}}; });
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-end.json"));
  snapshot["host"] = std::string(400000, 'a');  // std::regex would recurse once per character
  const CliResult r = validate_snapshot(schemas, dir.write("long.json", snapshot.dump()));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("$.host: 'aaaa"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is 400000 bytes long, too long for the pattern ^(a|b)*$ of " + schemas +
                       "/snapshot.schema.json (remat-report matches at most 1024 bytes against a pattern)"),
            std::string::npos)
      << r.err;

  snapshot["host"] = std::string(kMaxPatternInputBytes, 'b');  // at the limit: matched
  EXPECT_EQ(validate_snapshot(schemas, dir.write("limit.json", snapshot.dump())).code, 0);
}

TEST(SchemaDir, AKeywordOfTheWrongTypeNamesTheSchema) {
  TempDir dir;
  const std::string schemas =
      schema_dir_with(dir, [](nlohmann::json& schema) { schema["properties"]["host"] = {{"pattern", 5}}; });
  const CliResult r = validate_snapshot(schemas);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(schemas + "/snapshot.schema.json: a keyword's value has the wrong type or form"),
            std::string::npos)
      << r.err;
}

TEST(SchemaDir, AMissingSchemaFileNamesTheDirectoryNotTheDump) {
  TempDir dir;
  const std::string schemas = schema_dir_with(dir, [](nlohmann::json&) {});
  std::filesystem::remove(schemas + "/snapshot.schema.json");
  const CliResult r = validate_snapshot(schemas);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: --schema-dir " + schemas +
                       " holds no snapshot.schema.json, the schema for 'snapshot' dumps; copy it there from the "
                       "project's schemas/, or leave out --schema-dir to use the built-in schemas\n");

  // trace.schema.json refers to snapshot.schema.json for its tags and events.
  const CliResult trace = run({"validate", data_path("trace.jsonl"), "--schema-dir", schemas});
  EXPECT_EQ(trace.code, 2);
  EXPECT_EQ(trace.err, "remat-report: " + schemas +
                           "/trace.schema.json: schema reference 'snapshot.schema.json#/$defs/tag' names "
                           "snapshot.schema.json, which --schema-dir " +
                           schemas + " does not hold; copy it there from the project's schemas/\n");
}

TEST(SchemaDir, AKindNoSchemaKnowsIsStillTheDumpsProblem) {
  TempDir dir;
  const std::string schemas = schema_dir_with(dir, [](nlohmann::json&) {});
  const std::string dump = dir.write("k.json", R"({"kind":"frobs","schema_version":1})");
  const CliResult r = run({"validate", dump, "--schema-dir", schemas});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "invalid: " + dump + ": $.kind: no schema for dump kind 'frobs' (looked for frobs.schema.json)\n");
}

}  // namespace
}  // namespace remat::report::testing
