#pragma once
// How names from a dump are shown to people next to remat-report's own labels ("(untagged)",
// "(no site)", "(no recv slot)", "<no site>", "(3 more)", "other (2 groups)"): a name that
// reads like one -- wrapped in (...) or <...>, or "other (...)", with or without surrounding
// double quotes -- gets a pair of double quotes, so every name stays distinct from the labels
// and from each other. JSON and CSV give names unchanged and mark the labels instead.

#include <string>
#include <string_view>

namespace remat::report {

struct GroupLabel;

std::string shown_name(std::string_view name);
// A group's label as text shows it: remat-report's own placeholders as they are, names from
// the dump through shown_name.
std::string shown_label(const GroupLabel& label);

}  // namespace remat::report
