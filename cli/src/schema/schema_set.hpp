#pragma once
// JSON Schema checking for dumps against the files in schemas/. Supports the keywords those
// files use (type, const, enum, required, properties, items, minItems, minLength, minimum,
// maximum, exclusiveMinimum, pattern, oneOf, additionalProperties as true or false, $ref within
// and across files); a schema using any other keyword is refused when it is used, so a new
// keyword is never silently ignored.
// A schema that cannot be used (a reference cycle, an invalid pattern, a keyword of the wrong
// type, a reference to a file the set lacks) is a SchemaError naming the schema file, never a
// crash: `--schema-dir` reads files anyone can write.

#include "reader/json_path.hpp"

#include <simdjson.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace remat::report {

// A schema file is unusable; the message names the file and what to fix. Not an InputError:
// it says nothing about the dump being checked.
class SchemaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Strings longer than this are not matched against a `pattern`: std::regex recurses once per
// character and would overflow the stack. Our schemas' patterns match timestamps of 20.
inline constexpr std::size_t kMaxPatternInputBytes = 1024;
// `$ref` and `oneOf` hops in a row at one value: more means the schemas refer to each other in
// a cycle. Our schemas need at most 3.
inline constexpr unsigned kMaxReferenceHops = 64;

class SchemaSet {
 public:
  // The schemas compiled into remat-report, or those in `directory` when it is not empty.
  static SchemaSet load(const std::string& directory);

  void add(const std::string& file, std::string_view text);
  bool has(const std::string& file) const { return schemas_.count(file) != 0; }
  // Where a schema file comes from, for messages: its path under --schema-dir, or "built-in".
  std::string source_of(const std::string& file) const;
  const std::string& directory() const { return directory_; }

  // Checks `value` against `ref` ("trace.schema.json" or "trace.schema.json#/$defs/event"),
  // appending "path: problem" lines, at most `max_errors` in all.
  void validate(const std::string& ref, simdjson::dom::element value, const JsonPath& path,
                std::vector<std::string>& errors, std::size_t max_errors) const;

  // A schema inside one of the files, as the checker reaches it.
  struct Subschema {
    const nlohmann::json* schema = nullptr;
    std::string file;
  };
  // The schemas each element of the array at `members` (keys from the root of a document checked
  // against `ref`, such as {"trace", "events"}) must meet, for a document checked a piece at a
  // time (`validate` of a snapshot streaming by): the elements against these, and the document with
  // that array empty against `ref`, find a problem exactly where checking it whole finds one, up to
  // keywords on the array itself (`minItems`), which the empty array may fail. Empty where the
  // schemas on the way there can see the array only whole (`oneOf`) or refer in a cycle.
  std::optional<std::vector<Subschema>> element_schemas(const std::string& ref,
                                                        const std::vector<std::string>& members) const;
  // Checks `value` against each of `schemas`, as `validate` does.
  void validate(const std::vector<Subschema>& schemas, simdjson::dom::element value, const JsonPath& path,
                std::vector<std::string>& errors, std::size_t max_errors) const;

 private:
  // A schema object with its keywords looked up once: validating millions of trace lines
  // must not search the schema's maps for every value.
  struct Node {
    const nlohmann::json* ref = nullptr;
    std::string ref_text, ref_file;
    unsigned types = 0;  // bit set of accepted JSON types; 0 = any
    std::string type_text;
    const nlohmann::json* constant = nullptr;
    const nlohmann::json* allowed = nullptr;
    std::vector<std::string> required;
    std::vector<std::pair<std::string, const nlohmann::json*>> properties;
    const nlohmann::json* items = nullptr;
    const nlohmann::json* one_of = nullptr;
    bool closed = false;  // additionalProperties: false
    std::optional<long double> minimum, maximum, exclusive_minimum;
    std::optional<std::size_t> min_items, min_length;
    const std::regex* pattern = nullptr;
    std::string pattern_text;
  };
  const Node& node(const nlohmann::json& schema, const std::string& file) const;
  Node make_node(const nlohmann::json& schema, const std::string& file) const;
  const nlohmann::json& resolve(const std::string& ref, const std::string& current_file, std::string& file_out) const;
  // Appends `schema` and the schemas its `$ref`s lead to, which all apply to one value; false at a
  // `oneOf` or a reference cycle.
  bool applying(const nlohmann::json& schema, const std::string& file, std::vector<Subschema>& out,
                unsigned hops = 0) const;
  // `hops`: the $ref and oneOf steps taken at this value so far.
  void check(const nlohmann::json& schema, const std::string& file, simdjson::dom::element value, const JsonPath& path,
             std::vector<std::string>& errors, std::size_t max_errors, unsigned hops = 0) const;
  void check_keywords(const nlohmann::json& schema, const std::string& file) const;
  const std::regex& regex(const std::string& pattern, const std::string& file) const;
  [[noreturn]] void fail(const std::string& file, const std::string& problem) const;

  std::string directory_;  // empty for the built-in schemas
  std::map<std::string, nlohmann::json> schemas_;
  mutable std::map<std::string, std::unique_ptr<std::regex>> regexes_;
  mutable std::unordered_map<const nlohmann::json*, Node> nodes_;
  mutable std::map<std::string, std::pair<const nlohmann::json*, std::string>> roots_;
};

// The schema files compiled in: (file name, text).
std::vector<std::pair<std::string_view, std::string_view>> embedded_schemas();

}  // namespace remat::report
