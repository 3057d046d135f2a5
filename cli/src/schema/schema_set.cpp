#include "schema/schema_set.hpp"

#include "core/errors.hpp"
#include "reader/json_fields.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace remat::report {

using simdjson::dom::element;
using simdjson::dom::element_type;

SchemaSet SchemaSet::load(const std::string& directory) {
  SchemaSet set;
  if (directory.empty()) {
    for (const auto& [file, text] : embedded_schemas()) set.add(std::string(file), text);
    return set;
  }
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 12 || name.compare(name.size() - 12, 12, ".schema.json") != 0) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    set.add(name, text.str());
  }
  if (error) throw UsageError(fmt::format("--schema-dir {}: {}", directory, error.message()));
  return set;
}

void SchemaSet::add(const std::string& file, std::string_view text) {
  nlohmann::json schema = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (schema.is_discarded() || !schema.is_object()) throw InputError(file, "schema is not a JSON object");
  check_keywords(schema, file);
  schemas_[file] = std::move(schema);
}

void SchemaSet::check_keywords(const nlohmann::json& schema, const std::string& file) const {
  static const std::set<std::string> kKnown = {
      "$schema", "$id",      "title",       "description", "$defs",   "type",    "const",   "enum",
      "required", "properties", "items",    "minItems",    "minimum", "maximum", "exclusiveMinimum",
      "pattern",  "oneOf",    "$ref"};
  if (!schema.is_object()) return;
  for (const auto& [key, value] : schema.items()) {
    if (!kKnown.count(key)) {
      throw InputError(file, fmt::format("schema keyword '{}' is not supported by remat-report's validator", key));
    }
    if (key == "properties" || key == "$defs") {
      for (const auto& [name, sub] : value.items()) check_keywords(sub, file);
    } else if (key == "items") {
      check_keywords(value, file);
    } else if (key == "oneOf") {
      for (const auto& sub : value) check_keywords(sub, file);
    }
  }
}

const nlohmann::json& SchemaSet::resolve(const std::string& ref, const std::string& current_file,
                                         std::string& file_out) const {
  const std::size_t hash = ref.find('#');
  file_out = hash == 0 ? current_file : ref.substr(0, hash);
  const auto it = schemas_.find(file_out);
  if (it == schemas_.end()) throw InputError(current_file, fmt::format("schema reference '{}' names no loaded schema", ref));
  if (hash == std::string::npos || hash + 1 == ref.size()) return it->second;
  const nlohmann::json::json_pointer pointer(ref.substr(hash + 1));
  if (!it->second.contains(pointer)) throw InputError(current_file, fmt::format("schema reference '{}' points nowhere", ref));
  return it->second.at(pointer);
}

const std::regex& SchemaSet::regex(const std::string& pattern) const {
  auto& slot = regexes_[pattern];
  if (!slot) slot = std::make_unique<std::regex>(pattern, std::regex::ECMAScript);
  return *slot;
}

void SchemaSet::validate(const std::string& ref, element value, const JsonPath& path, std::vector<std::string>& errors,
                         std::size_t max_errors) const {
  std::string file;
  const nlohmann::json& schema = resolve(ref, "", file);
  check(schema, file, value, path, errors, max_errors);
}

namespace {

bool is_integer(element v) {
  if (v.type() == element_type::INT64 || v.type() == element_type::UINT64) return true;
  if (v.type() == element_type::DOUBLE) {
    const double d = double(v);
    return d == static_cast<double>(static_cast<long long>(d));
  }
  return false;
}

bool is_number(element v) {
  return v.type() == element_type::INT64 || v.type() == element_type::UINT64 || v.type() == element_type::DOUBLE;
}

long double number_of(element v) {
  switch (v.type()) {
    case element_type::INT64: return static_cast<long double>(std::int64_t(v));
    case element_type::UINT64: return static_cast<long double>(std::uint64_t(v));
    default: return static_cast<long double>(double(v));
  }
}

bool has_type(element v, const std::string& type) {
  if (type == "object") return v.type() == element_type::OBJECT;
  if (type == "array") return v.type() == element_type::ARRAY;
  if (type == "string") return v.type() == element_type::STRING;
  if (type == "integer") return is_integer(v);
  if (type == "number") return is_number(v);
  if (type == "boolean") return v.type() == element_type::BOOL;
  if (type == "null") return v.type() == element_type::NULL_VALUE;
  return false;
}

bool equals(element v, const nlohmann::json& expected) {
  if (expected.is_string()) return v.type() == element_type::STRING && std::string_view(v) == expected.get<std::string>();
  if (expected.is_boolean()) return v.type() == element_type::BOOL && bool(v) == expected.get<bool>();
  if (expected.is_null()) return v.type() == element_type::NULL_VALUE;
  if (expected.is_number()) return is_number(v) && number_of(v) == expected.get<long double>();
  return false;
}

std::string show(element v) {
  switch (v.type()) {
    case element_type::STRING: return "'" + printable(std::string_view(v), 40) + "'";
    case element_type::INT64: return std::to_string(std::int64_t(v));
    case element_type::UINT64: return std::to_string(std::uint64_t(v));
    case element_type::DOUBLE: return fmt::format("{}", double(v));
    case element_type::BOOL: return bool(v) ? "true" : "false";
    case element_type::NULL_VALUE: return "null";
    default: return std::string(json::type_name(v));
  }
}

std::string show(const nlohmann::json& j) { return j.is_string() ? j.get<std::string>() : j.dump(); }

}  // namespace

void SchemaSet::check(const nlohmann::json& schema, const std::string& file, element value, const JsonPath& path,
                      std::vector<std::string>& errors, std::size_t max_errors) const {
  auto fail = [&](const std::string& message) {
    if (errors.size() < max_errors) errors.push_back(path.str() + ": " + message);
  };
  if (errors.size() >= max_errors) return;
  if (const auto ref = schema.find("$ref"); ref != schema.end()) {
    std::string target_file;
    const nlohmann::json& target = resolve(ref->get<std::string>(), file, target_file);
    check(target, target_file, value, path, errors, max_errors);
  }
  if (const auto type = schema.find("type"); type != schema.end()) {
    std::vector<std::string> types;
    if (type->is_array()) for (const auto& t : *type) types.push_back(t.get<std::string>());
    else types.push_back(type->get<std::string>());
    bool ok = false;
    for (const std::string& t : types) ok = ok || has_type(value, t);
    if (!ok) {
      std::string wanted;
      for (const std::string& t : types) wanted += (wanted.empty() ? "" : " or ") + t;
      fail(fmt::format("expected {}, found {}", wanted, json::type_name(value)));
      return;
    }
  }
  if (const auto c = schema.find("const"); c != schema.end() && !equals(value, *c)) {
    fail(fmt::format("must be {}, found {}", show(*c), show(value)));
  }
  if (const auto e = schema.find("enum"); e != schema.end()) {
    bool ok = false;
    std::string allowed;
    for (const auto& option : *e) {
      ok = ok || equals(value, option);
      allowed += (allowed.empty() ? "" : ", ") + show(option);
    }
    if (!ok) fail(fmt::format("{} is not one of {}", show(value), allowed));
  }
  if (is_number(value)) {
    const long double v = number_of(value);
    if (const auto m = schema.find("minimum"); m != schema.end() && v < m->get<long double>()) {
      fail(fmt::format("{} is below the minimum {}", show(value), show(*m)));
    }
    if (const auto m = schema.find("maximum"); m != schema.end() && v > m->get<long double>()) {
      fail(fmt::format("{} is above the maximum {}", show(value), show(*m)));
    }
    if (const auto m = schema.find("exclusiveMinimum"); m != schema.end() && v <= m->get<long double>()) {
      fail(fmt::format("{} must be greater than {}", show(value), show(*m)));
    }
  }
  if (value.type() == element_type::STRING) {
    if (const auto p = schema.find("pattern"); p != schema.end()) {
      const std::string text{std::string_view(value)};
      if (!std::regex_search(text, regex(p->get<std::string>()))) {
        fail(fmt::format("{} does not match the pattern {}", show(value), p->get<std::string>()));
      }
    }
  }
  if (value.type() == element_type::OBJECT) {
    const simdjson::dom::object object(value);
    if (const auto required = schema.find("required"); required != schema.end()) {
      for (const auto& key : *required) {
        element member;
        if (object.at_key(key.get<std::string>()).get(member) != simdjson::SUCCESS) {
          if (errors.size() < max_errors) errors.push_back(path.key(key.get<std::string>()).str() + ": missing required field");
        }
      }
    }
    if (const auto properties = schema.find("properties"); properties != schema.end()) {
      for (const auto& [key, sub] : properties->items()) {
        element member;
        if (object.at_key(key).get(member) == simdjson::SUCCESS) check(sub, file, member, path.key(key), errors, max_errors);
      }
    }
  }
  if (value.type() == element_type::ARRAY) {
    const simdjson::dom::array array(value);
    if (const auto m = schema.find("minItems"); m != schema.end() && array.size() < m->get<std::size_t>()) {
      fail(fmt::format("holds {} items, fewer than the minimum {}", array.size(), m->get<std::size_t>()));
    }
    if (const auto items = schema.find("items"); items != schema.end()) {
      std::size_t i = 0;
      for (element item : array) {
        if (errors.size() >= max_errors) break;
        check(*items, file, item, path.index(i++), errors, max_errors);
      }
    }
  }
  if (const auto one_of = schema.find("oneOf"); one_of != schema.end()) {
    std::size_t matches = 0;
    std::string reasons;
    for (const auto& alternative : *one_of) {
      std::vector<std::string> sub_errors;
      check(alternative, file, value, path, sub_errors, 1);
      if (sub_errors.empty()) ++matches;
      else reasons += (reasons.empty() ? "" : "; or ") + sub_errors.front();
    }
    if (matches != 1) {
      fail(matches == 0 ? "matches none of the allowed shapes: " + reasons
                        : "matches more than one of the allowed shapes");
    }
  }
}

}  // namespace remat::report
