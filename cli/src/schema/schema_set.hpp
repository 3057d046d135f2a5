#pragma once
// JSON Schema checking for dumps against the files in schemas/. Supports the keywords those
// files use (type, const, enum, required, properties, items, minItems, minLength, minimum,
// maximum, exclusiveMinimum, pattern, oneOf, $ref within and across files); a schema using
// any other keyword is refused when it is used, so a new keyword is never silently ignored.

#include "reader/json_path.hpp"

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

class SchemaSet {
 public:
  // The schemas compiled into remat-report, or those in `directory` when it is not empty.
  static SchemaSet load(const std::string& directory);

  void add(const std::string& file, std::string_view text);
  bool has(const std::string& file) const { return schemas_.count(file) != 0; }

  // Checks `value` against `ref` ("trace.schema.json" or "trace.schema.json#/$defs/event"),
  // appending "path: problem" lines, at most `max_errors` in all.
  void validate(const std::string& ref, simdjson::dom::element value, const JsonPath& path,
                std::vector<std::string>& errors, std::size_t max_errors) const;

 private:
  // A schema object with its keywords looked up once: validating millions of trace lines
  // must not search the schema's maps for every value.
  struct Node {
    const nlohmann::json* ref = nullptr;
    std::string ref_file;
    unsigned types = 0;  // bit set of accepted JSON types; 0 = any
    std::string type_text;
    const nlohmann::json* constant = nullptr;
    const nlohmann::json* allowed = nullptr;
    std::vector<std::string> required;
    std::vector<std::pair<std::string, const nlohmann::json*>> properties;
    const nlohmann::json* items = nullptr;
    const nlohmann::json* one_of = nullptr;
    std::optional<long double> minimum, maximum, exclusive_minimum;
    std::optional<std::size_t> min_items, min_length;
    const std::regex* pattern = nullptr;
    std::string pattern_text;
  };
  const Node& node(const nlohmann::json& schema, const std::string& file) const;
  const nlohmann::json& resolve(const std::string& ref, const std::string& current_file, std::string& file_out) const;
  void check(const nlohmann::json& schema, const std::string& file, simdjson::dom::element value, const JsonPath& path,
             std::vector<std::string>& errors, std::size_t max_errors) const;
  void check_keywords(const nlohmann::json& schema, const std::string& file) const;
  const std::regex& regex(const std::string& pattern) const;

  std::map<std::string, nlohmann::json> schemas_;
  mutable std::map<std::string, std::unique_ptr<std::regex>> regexes_;
  mutable std::unordered_map<const nlohmann::json*, Node> nodes_;
  mutable std::map<std::string, std::pair<const nlohmann::json*, std::string>> roots_;
};

// The schema files compiled in: (file name, text).
std::vector<std::pair<std::string_view, std::string_view>> embedded_schemas();

}  // namespace remat::report
