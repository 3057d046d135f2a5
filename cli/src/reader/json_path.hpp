#pragma once
// A JSON path built on the stack while walking a document, turned into text such as
// `$.segments[3].blocks[0].size` only when an error needs it. A path holds its parent by
// address: keep a path only while every path it was built from lives (name each one; a path
// built from a temporary may be used only within the expression that built it).

#include <cstddef>
#include <string>
#include <string_view>

namespace remat::report {

class JsonPath {
 public:
  JsonPath() = default;  // the root, `$`

  JsonPath key(std::string_view name) const { return JsonPath(this, name, 0, Kind::key); }
  JsonPath index(std::size_t i) const { return JsonPath(this, {}, i, Kind::index); }

  std::string str() const;

 private:
  enum class Kind { root, key, index };
  JsonPath(const JsonPath* parent, std::string_view name, std::size_t i, Kind kind)
      : parent_(parent), name_(name), index_(i), kind_(kind) {}

  const JsonPath* parent_ = nullptr;
  std::string_view name_;
  std::size_t index_ = 0;
  Kind kind_ = Kind::root;
};

}  // namespace remat::report
