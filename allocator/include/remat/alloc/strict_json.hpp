#pragma once
// JSON read strictly, for the dumps the producers read back (budget profiles and plans, pipeline
// stage profiles): a key given twice in one object is refused, since JSON readers disagree on
// which of the two wins. Header-only over nlohmann::json, which those readers link.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <exception>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace remat::alloc {

namespace detail {
// nlohmann's message without its "[json.exception.parse_error.101] " tag, which names the
// library's exception rather than the problem.
inline std::string json_error_words(const std::exception& error) {
  std::string_view what = error.what();
  if (what.rfind("[json.exception.", 0) == 0) {
    if (const std::size_t end = what.find("] "); end != std::string_view::npos) what.remove_prefix(end + 2);
  }
  return std::string(what);
}
}  // namespace detail

// The document in `text` (as nlohmann::json or nlohmann::ordered_json); `refuse(path, problem)`
// is called, and must throw, when the text is not JSON, a number in it is too large for a double
// (1e400), or an object gives a key twice, with the problem said in words and `path` the value's
// JSON path ("$.regions[2].seconds"; "$" when the text is no JSON at all).
template <class Json = nlohmann::json, class Refuse>
Json parse_strict_json(std::string_view text, Refuse&& refuse) {
  using Event = typename Json::parse_event_t;
  // The containers open around the parser, each with the keys it gave and where it is now.
  struct Open {
    bool array = false;
    std::set<std::string> keys;
    std::string key;
    std::size_t index = 0;
  };
  std::vector<Open> open;
  // The path through the first `depth` open containers: of the value being read at open.size().
  auto path = [&](std::size_t depth) {
    std::string out = "$";
    for (std::size_t i = 0; i < depth; ++i) {
      if (open[i].array) {
        out.append("[").append(std::to_string(open[i].index)).append("]");
      } else {
        out.append(".").append(open[i].key);
      }
    }
    return out;
  };
  auto element_done = [&] {
    if (!open.empty() && open.back().array) ++open.back().index;
  };
  std::string repeated;
  std::string repeated_at;
  const typename Json::parser_callback_t check = [&](int, Event event, Json& parsed) {
    switch (event) {
      case Event::object_start: open.push_back({}); break;
      case Event::array_start: open.push_back({true}); break;
      case Event::object_end:
      case Event::array_end:
        if (!open.empty()) open.pop_back();
        element_done();
        break;
      case Event::key:
        if (!open.empty()) {
          const std::string key = parsed.template get<std::string>();
          open.back().key = key;
          if (!open.back().keys.insert(key).second && repeated.empty()) {
            repeated = key;
            repeated_at = path(open.size() - 1);  // the object's path
          }
        }
        break;
      case Event::value: element_done(); break;
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text, check);
  } catch (const typename Json::parse_error& error) {
    refuse(std::string("$"), "not JSON (" + detail::json_error_words(error) + ")");
  } catch (const typename Json::out_of_range& error) {
    // The lexer read a number past a double's range; the path is the value being read.
    refuse(path(open.size()),
           "is a number too large for a double (" + detail::json_error_words(error) + "); write a finite number");
  }
  if (!repeated.empty()) refuse(repeated_at, "the key '" + repeated + "' is given twice in one object; keep one");
  return root;
}

}  // namespace remat::alloc
