#include "schema/schema_set.hpp"

#include "core/errors.hpp"
#include "reader/json_fields.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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
  set.directory_ = directory;
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

std::string SchemaSet::source_of(const std::string& file) const {
  return directory_.empty() ? file : (std::filesystem::path(directory_) / file).string();
}

void SchemaSet::fail(const std::string& file, const std::string& problem) const {
  throw SchemaError(file.empty() ? problem : source_of(file) + ": " + problem);
}

void SchemaSet::add(const std::string& file, std::string_view text) {
  nlohmann::json schema = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (schema.is_discarded() || !schema.is_object()) fail(file, "schema is not a JSON object");
  schemas_[file] = std::move(schema);
}

void SchemaSet::check_keywords(const nlohmann::json& schema, const std::string& file) const {
  static const std::set<std::string> kKnown = {"$schema",   "$id",        "title",   "description",
                                               "$defs",     "type",       "const",   "enum",
                                               "required",  "properties", "items",   "minItems",
                                               "minLength", "minimum",    "maximum", "exclusiveMinimum",
                                               "pattern",   "oneOf",      "$ref",    "additionalProperties"};
  if (!schema.is_object()) fail(file, "a schema inside it is not a JSON object");
  for (const auto& item : schema.items()) {
    if (!kKnown.count(item.key())) {
      fail(file, fmt::format("schema keyword '{}' is not supported by remat-report's validator", item.key()));
    }
  }
}

const nlohmann::json& SchemaSet::resolve(const std::string& ref, const std::string& current_file,
                                         std::string& file_out) const {
  const std::size_t hash = ref.find('#');
  file_out = hash == 0 ? current_file : ref.substr(0, hash);
  const auto it = schemas_.find(file_out);
  if (it == schemas_.end()) {
    fail(current_file, directory_.empty()
                           ? fmt::format("schema reference '{}' names no built-in schema", ref)
                           : fmt::format("schema reference '{}' names {}, which --schema-dir {} does not hold; copy it "
                                         "there from the project's schemas/",
                                         ref, file_out, directory_));
  }
  if (hash == std::string::npos || hash + 1 == ref.size()) return it->second;
  const nlohmann::json::json_pointer pointer(ref.substr(hash + 1));
  if (!it->second.contains(pointer)) fail(current_file, fmt::format("schema reference '{}' points nowhere", ref));
  return it->second.at(pointer);
}

const std::regex& SchemaSet::regex(const std::string& pattern, const std::string& file) const {
  auto& slot = regexes_[pattern];
  if (!slot) {
    try {
      slot = std::make_unique<std::regex>(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& error) {
      fail(file, fmt::format("pattern '{}' is not a valid regular expression ({}); write it in ECMAScript syntax",
                             printable(pattern), error.what()));
    }
  }
  return *slot;
}

void SchemaSet::validate(const std::string& ref, element value, const JsonPath& path, std::vector<std::string>& errors,
                         std::size_t max_errors) const {
  auto it = roots_.find(ref);
  if (it == roots_.end()) {
    std::string file;
    const nlohmann::json& schema = resolve(ref, "", file);
    it = roots_.emplace(ref, std::make_pair(&schema, file)).first;
  }
  check(*it->second.first, it->second.second, value, path, errors, max_errors);
}

bool SchemaSet::applying(const nlohmann::json& schema, const std::string& file, std::vector<Subschema>& out,
                         unsigned hops) const {
  const Node& n = node(schema, file);
  if (n.one_of != nullptr || hops >= kMaxReferenceHops) return false;
  out.push_back({&schema, file});
  return n.ref == nullptr || applying(*n.ref, n.ref_file, out, hops + 1);
}

std::optional<std::vector<SchemaSet::Subschema>> SchemaSet::element_schemas(
    const std::string& ref, const std::vector<std::string>& members) const {
  std::string file;
  const nlohmann::json& root = resolve(ref, "", file);
  std::vector<Subschema> at;
  if (!applying(root, file, at)) return std::nullopt;
  for (const std::string& member : members) {
    std::vector<Subschema> next;
    for (const Subschema& s : at) {
      for (const auto& [key, sub] : node(*s.schema, s.file).properties) {
        if (key == member && !applying(*sub, s.file, next)) return std::nullopt;
      }
    }
    at = std::move(next);
  }
  std::vector<Subschema> items;
  for (const Subschema& s : at) {
    if (const nlohmann::json* each = node(*s.schema, s.file).items) items.push_back({each, s.file});
  }
  return items;
}

void SchemaSet::validate(const std::vector<Subschema>& schemas, element value, const JsonPath& path,
                         std::vector<std::string>& errors, std::size_t max_errors) const {
  for (const Subschema& s : schemas) check(*s.schema, s.file, value, path, errors, max_errors);
}

namespace {
enum TypeBit : unsigned { kObject = 1, kArray = 2, kString = 4, kInteger = 8, kNumber = 16, kBoolean = 32, kNull = 64 };

unsigned type_bit(const std::string& type) {
  if (type == "object") return kObject;
  if (type == "array") return kArray;
  if (type == "string") return kString;
  if (type == "integer") return kInteger;
  if (type == "number") return kNumber;
  if (type == "boolean") return kBoolean;
  if (type == "null") return kNull;
  return 0;
}
}  // namespace

const SchemaSet::Node& SchemaSet::node(const nlohmann::json& schema, const std::string& file) const {
  const auto found = nodes_.find(&schema);
  if (found != nodes_.end()) return found->second;
  try {
    return nodes_.emplace(&schema, make_node(schema, file)).first->second;
  } catch (const nlohmann::json::exception& error) {
    fail(file, fmt::format("a keyword's value has the wrong type or form ({})", error.what()));
  }
}

SchemaSet::Node SchemaSet::make_node(const nlohmann::json& schema, const std::string& file) const {
  check_keywords(schema, file);
  Node n;
  if (const auto ref = schema.find("$ref"); ref != schema.end()) {
    n.ref_text = ref->get<std::string>();
    n.ref = &resolve(n.ref_text, file, n.ref_file);
  }
  if (const auto type = schema.find("type"); type != schema.end()) {
    std::vector<std::string> types;
    if (type->is_array())
      for (const auto& t : *type) types.push_back(t.get<std::string>());
    else
      types.push_back(type->get<std::string>());
    for (const std::string& t : types) {
      n.types |= type_bit(t);
      n.type_text += (n.type_text.empty() ? "" : " or ") + t;
    }
  }
  if (const auto c = schema.find("const"); c != schema.end()) n.constant = &*c;
  if (const auto e = schema.find("enum"); e != schema.end()) n.allowed = &*e;
  if (const auto r = schema.find("required"); r != schema.end()) {
    for (const auto& key : *r) n.required.push_back(key.get<std::string>());
  }
  if (const auto p = schema.find("properties"); p != schema.end()) {
    for (const auto& [key, sub] : p->items()) n.properties.emplace_back(key, &sub);
  }
  if (const auto a = schema.find("additionalProperties"); a != schema.end()) {
    if (!a->is_boolean()) {
      fail(file,
           "'additionalProperties' is supported as true or false only, not as a schema; give false to refuse "
           "fields the 'properties' do not name, or leave it out");
    }
    n.closed = !a->get<bool>();
  }
  if (const auto i = schema.find("items"); i != schema.end()) n.items = &*i;
  if (const auto o = schema.find("oneOf"); o != schema.end()) n.one_of = &*o;
  if (const auto m = schema.find("minimum"); m != schema.end()) n.minimum = m->get<long double>();
  if (const auto m = schema.find("maximum"); m != schema.end()) n.maximum = m->get<long double>();
  if (const auto m = schema.find("exclusiveMinimum"); m != schema.end()) n.exclusive_minimum = m->get<long double>();
  if (const auto m = schema.find("minItems"); m != schema.end()) n.min_items = m->get<std::size_t>();
  if (const auto m = schema.find("minLength"); m != schema.end()) n.min_length = m->get<std::size_t>();
  if (const auto p = schema.find("pattern"); p != schema.end()) {
    n.pattern_text = p->get<std::string>();
    n.pattern = &regex(n.pattern_text, file);
  }
  return n;
}

namespace {

bool is_integer(element v) {
  if (v.type() == element_type::INT64 || v.type() == element_type::UINT64) return true;
  if (v.type() == element_type::DOUBLE) {
    const double d = double(v);
    return std::isfinite(d) && std::floor(d) == d;  // 1.0 is an integer; 1e300 too, without a cast
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

bool equals(element v, const nlohmann::json& expected) {
  if (expected.is_string())
    return v.type() == element_type::STRING && std::string_view(v) == expected.get<std::string>();
  if (expected.is_boolean()) return v.type() == element_type::BOOL && bool(v) == expected.get<bool>();
  if (expected.is_null()) return v.type() == element_type::NULL_VALUE;
  if (expected.is_number()) return is_number(v) && number_of(v) == expected.get<long double>();
  return false;
}

std::string show(element v) {
  switch (v.type()) {
    case element_type::STRING: return fmt::format("'{}'", printable(std::string_view(v), 40));
    case element_type::INT64: return std::to_string(std::int64_t(v));
    case element_type::UINT64: return std::to_string(std::uint64_t(v));
    case element_type::DOUBLE: return json::show_double(double(v));
    case element_type::BOOL: return bool(v) ? "true" : "false";
    case element_type::NULL_VALUE: return "null";
    default: return std::string(json::type_name(v));
  }
}

std::string show(const nlohmann::json& j) { return j.is_string() ? j.get<std::string>() : j.dump(); }

}  // namespace

void SchemaSet::check(const nlohmann::json& schema, const std::string& file, element value, const JsonPath& path,
                      std::vector<std::string>& errors, std::size_t max_errors, unsigned hops) const {
  auto fail = [&](const std::string& message) {
    if (errors.size() < max_errors) errors.push_back(path.str() + ": " + message);
  };
  if (errors.size() >= max_errors) return;
  const Node& n = node(schema, file);
  if (n.ref != nullptr) {
    if (hops >= kMaxReferenceHops) {
      SchemaSet::fail(file, fmt::format("'$ref' '{}' is part of a reference cycle: more than {} references in a row "
                                        "never reach a schema that checks the value; make the chain end",
                                        printable(n.ref_text), kMaxReferenceHops));
    }
    check(*n.ref, n.ref_file, value, path, errors, max_errors, hops + 1);
  }
  if (n.types != 0) {
    unsigned actual = 0;
    switch (value.type()) {
      case element_type::OBJECT: actual = kObject; break;
      case element_type::ARRAY: actual = kArray; break;
      case element_type::STRING: actual = kString; break;
      case element_type::BOOL: actual = kBoolean; break;
      case element_type::NULL_VALUE: actual = kNull; break;
      default: actual = kNumber | (is_integer(value) ? kInteger : 0u); break;
    }
    if ((n.types & actual) == 0) {
      fail(fmt::format("expected {}, found {}", n.type_text, json::type_name(value)));
      return;
    }
  }
  if (n.constant != nullptr && !equals(value, *n.constant)) {
    fail(fmt::format("must be {}, found {}", show(*n.constant), show(value)));
  }
  if (n.allowed != nullptr) {
    bool ok = false;
    for (const auto& option : *n.allowed) ok = ok || equals(value, option);
    if (!ok) {
      std::string allowed;
      for (const auto& option : *n.allowed) allowed += (allowed.empty() ? "" : ", ") + show(option);
      fail(fmt::format("{} is not one of {}", show(value), allowed));
    }
  }
  if (is_number(value) && (n.minimum || n.maximum || n.exclusive_minimum)) {
    const long double v = number_of(value);
    if (n.minimum && v < *n.minimum)
      fail(fmt::format("{} is below the minimum {}", show(value), static_cast<double>(*n.minimum)));
    if (n.maximum && v > *n.maximum)
      fail(fmt::format("{} is above the maximum {}", show(value), static_cast<double>(*n.maximum)));
    if (n.exclusive_minimum && v <= *n.exclusive_minimum) {
      fail(fmt::format("{} must be greater than {}", show(value), static_cast<double>(*n.exclusive_minimum)));
    }
  }
  if (n.min_length && value.type() == element_type::STRING) {
    std::size_t length = 0;  // in code points, as JSON Schema counts
    for (const char c : std::string_view(value)) length += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
    if (length < *n.min_length)
      fail(fmt::format("is {} characters long, shorter than the minimum {}", length, *n.min_length));
  }
  if (n.pattern != nullptr && value.type() == element_type::STRING) {
    const std::string text{std::string_view(value)};
    if (text.size() > kMaxPatternInputBytes) {
      fail(
          fmt::format("{} is {} bytes long, too long for the pattern {} of {} (remat-report matches at most {} bytes "
                      "against a pattern)",
                      show(value), text.size(), n.pattern_text, source_of(file), kMaxPatternInputBytes));
    } else if (!std::regex_search(text, *n.pattern)) {
      fail(fmt::format("{} does not match the pattern {}", show(value), n.pattern_text));
    }
  }
  if (value.type() == element_type::OBJECT) {
    const simdjson::dom::object object(value);
    element member;
    for (const std::string& key : n.required) {
      if (object.at_key(key).get(member) != simdjson::SUCCESS && errors.size() < max_errors) {
        errors.push_back(path.key(key).str() + ": missing required field");
      }
    }
    for (const auto& [key, sub] : n.properties) {
      if (object.at_key(key).get(member) == simdjson::SUCCESS)
        check(*sub, file, member, path.key(key), errors, max_errors);
    }
    if (n.closed) {
      for (const auto field : object) {
        const bool named = std::any_of(n.properties.begin(), n.properties.end(),
                                       [&](const auto& property) { return property.first == field.key; });
        if (!named && errors.size() < max_errors) {
          errors.push_back(path.key(std::string(field.key)).str() +
                           ": not a field of this object (a field of another "
                           "kind or version, or a misspelling)");
        }
      }
    }
  }
  if (value.type() == element_type::ARRAY) {
    const simdjson::dom::array array(value);
    if (n.min_items && array.size() < *n.min_items) {
      fail(fmt::format("holds {} items, fewer than the minimum {}", array.size(), *n.min_items));
    }
    if (n.items != nullptr) {
      std::size_t i = 0;
      for (element item : array) {
        if (errors.size() >= max_errors) break;
        check(*n.items, file, item, path.index(i++), errors, max_errors);
      }
    }
  }
  if (n.one_of != nullptr) {
    std::size_t matches = 0;
    std::string reasons;
    if (hops >= kMaxReferenceHops) {
      SchemaSet::fail(file, fmt::format("'oneOf' is part of a reference cycle: more than {} references and "
                                        "alternatives in a row never reach a schema that checks the value; make the "
                                        "chain end",
                                        kMaxReferenceHops));
    }
    for (const auto& alternative : *n.one_of) {
      std::vector<std::string> sub_errors;
      check(alternative, file, value, path, sub_errors, 1, hops + 1);
      if (sub_errors.empty())
        ++matches;
      else
        reasons += (reasons.empty() ? "" : "; or ") + sub_errors.front();
    }
    if (matches != 1) {
      fail(matches == 0 ? "matches none of the allowed shapes: " + reasons
                        : "matches more than one of the allowed shapes");
    }
  }
}

}  // namespace remat::report
