#include "reader/duplicate_keys.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace remat::report {

namespace {

using simdjson::dom::element_type;

[[noreturn]] void duplicate(std::string_view key, const JsonPath& object_path) {
  throw InputError(object_path.key(key).str(),
                   fmt::format("duplicate key '{}': the object holds it more than once, and JSON readers disagree on "
                               "which value counts; keep one",
                               printable(key)));
}

// Objects this small are checked pairwise; larger ones through a sorted copy of their keys.
constexpr std::size_t kPairwiseLimit = 16;

void check_object(simdjson::dom::object object, const JsonPath& path) {
  std::string_view small[kPairwiseLimit];
  std::size_t count = 0;
  std::vector<std::string_view> large;
  for (const auto [key, value] : object) {
    if (count < kPairwiseLimit) {
      for (std::size_t i = 0; i < count; ++i) {
        if (small[i] == key) duplicate(key, path);
      }
      small[count] = key;
    } else {
      if (large.empty()) large.assign(small, small + kPairwiseLimit);
      large.push_back(key);
    }
    ++count;
    refuse_duplicate_keys(value, path.key(key));
  }
  if (large.empty()) return;
  std::sort(large.begin(), large.end());
  const auto repeated = std::adjacent_find(large.begin(), large.end());
  if (repeated != large.end()) duplicate(*repeated, path);
}

}  // namespace

void refuse_duplicate_keys(simdjson::dom::element value, const JsonPath& path) {
  switch (value.type()) {
    case element_type::OBJECT: check_object(simdjson::dom::object(value), path); break;
    case element_type::ARRAY: {
      std::size_t i = 0;
      for (const simdjson::dom::element item : simdjson::dom::array(value)) {
        if (item.type() == element_type::OBJECT || item.type() == element_type::ARRAY) {
          refuse_duplicate_keys(item, path.index(i));
        }
        ++i;
      }
      break;
    }
    default: break;
  }
}

}  // namespace remat::report
