#pragma once
// JSON read strictly, for the dumps the producers read back (budget profiles and plans, pipeline
// stage profiles): a key given twice in one object is refused, since JSON readers disagree on
// which of the two wins. Header-only over nlohmann::json, which those readers link.

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace remat::alloc {

// The document in `text` (as nlohmann::json or nlohmann::ordered_json); `refuse(problem)` is
// called, and must throw, when the text is not JSON or an object gives a key twice, with the
// problem said in words.
template <class Json = nlohmann::json, class Refuse>
Json parse_strict_json(std::string_view text, Refuse&& refuse) {
  using Event = typename Json::parse_event_t;
  std::vector<std::set<std::string>> keys;  // of the objects open around the parser
  std::string repeated;
  const typename Json::parser_callback_t check = [&](int, Event event, Json& parsed) {
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end && !keys.empty()) keys.pop_back();
    if (event == Event::key && !keys.empty() &&
        !keys.back().insert(parsed.template get<std::string>()).second && repeated.empty()) {
      repeated = parsed.template get<std::string>();
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text, check);
  } catch (const typename Json::parse_error& error) {
    refuse(std::string("not JSON (") + error.what() + ")");
  }
  if (!repeated.empty()) refuse("the key '" + repeated + "' is given twice in one object; keep one");
  return root;
}

}  // namespace remat::alloc
