#include "reader/json_path.hpp"

#include "core/errors.hpp"

#include <vector>

namespace remat::report {

std::string JsonPath::str() const {
  std::vector<const JsonPath*> chain;
  for (const JsonPath* p = this; p != nullptr; p = p->parent_) chain.push_back(p);
  std::string out;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const JsonPath& p = **it;
    switch (p.kind_) {
      case Kind::root: out += '$'; break;
      case Kind::key: out += '.'; out += printable(p.name_, 40); break;
      case Kind::index: out += '[' + std::to_string(p.index_) + ']'; break;
    }
  }
  return out;
}

}  // namespace remat::report
