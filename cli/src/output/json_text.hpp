#pragma once
// JSON for machines that is also safe on a terminal: strings keep their exact value, and the
// characters a terminal would act on are written as \u escapes (nlohmann writes C0 controls
// so already; DEL and the C1 controls U+0080-U+009F are escaped here).

#include <nlohmann/json.hpp>

#include <string>

namespace remat::report {

// `value` serialised with `indent` (-1: one line); invalid UTF-8 is replaced, not thrown.
std::string json_text(const nlohmann::ordered_json& value, int indent);

}  // namespace remat::report
