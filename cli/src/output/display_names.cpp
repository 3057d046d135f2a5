#include "output/display_names.hpp"

#include "analysis/grouping.hpp"

namespace remat::report {

namespace {

bool wrapped(std::string_view text, char open, char close) {
  return text.size() >= 2 && text.front() == open && text.back() == close;
}

bool reads_like_own_label(std::string_view name) {
  while (wrapped(name, '"', '"')) name = name.substr(1, name.size() - 2);
  return wrapped(name, '(', ')') || wrapped(name, '<', '>') || (name.substr(0, 7) == "other (" && name.back() == ')');
}

}  // namespace

std::string shown_name(std::string_view name) {
  if (!reads_like_own_label(name)) return std::string(name);
  std::string quoted;
  quoted.reserve(name.size() + 2);
  quoted += '"';
  quoted += name;
  quoted += '"';
  return quoted;
}

std::string shown_label(const GroupLabel& label) { return label.placeholder ? label.text : shown_name(label.text); }

}  // namespace remat::report
