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
#include <type_traits>
#include <utility>
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

// Whether an object type keeps its keys in the order given (nlohmann::ordered_json's: a vector).
template <class Object, class = void>
struct AppendsInOrder : std::false_type {};
template <class Object>
struct AppendsInOrder<Object, std::void_t<decltype(std::declval<Object&>().emplace_back(
                                  std::declval<const std::string&>(), std::declval<typename Object::mapped_type>()))>>
    : std::true_type {};

// Builds the document from the parser's events, as Json::parse does, but appends each key of an
// ordered object in constant time (nlohmann's own builders look every key up among those before
// it, and scan a container for discarded values each time an object in it ends: quadratic in a
// plan's 10,000 decisions and regions), and keeps the path and the keys of each open container.
// A key given twice is noted, not refused at once: the caller refuses it after the parse, so that
// a dump that is no JSON at all is named as such first.
template <class Json>
class StrictBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  explicit StrictBuilder(Json& root) : root_(root) {}

  bool null() { return add(Json(nullptr)); }
  bool boolean(bool value) { return add(Json(value)); }
  bool number_integer(number_integer_t value) { return add(Json(value)); }
  bool number_unsigned(number_unsigned_t value) { return add(Json(value)); }
  bool number_float(number_float_t value, const string_t&) { return add(Json(value)); }
  bool string(string_t& value) { return add(Json(std::move(value))); }
  bool binary(binary_t& value) { return add(Json(std::move(value))); }

  bool start_object(std::size_t) { return open(Json::object(), false); }
  bool start_array(std::size_t) { return open(Json::array(), true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& name) {
    Open& object = open_.back();
    if (!object.keys.insert(name).second && repeated_.empty()) {
      repeated_ = name;
      repeated_at_ = path(open_.size() - 1);  // the object's path
    }
    object.key = name;
    return true;
  }

  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& error) {
    throw error;
  }

  // The path through the first `depth` open containers: of the value being read at open_.size().
  std::string path(std::size_t depth) const {
    std::string out = "$";
    for (std::size_t i = 0; i < depth; ++i) {
      if (open_[i].array) {
        out.append("[").append(std::to_string(open_[i].index)).append("]");
      } else {
        out.append(".").append(open_[i].key);
      }
    }
    return out;
  }
  std::size_t depth() const { return open_.size(); }
  const std::string& repeated() const { return repeated_; }
  const std::string& repeated_at() const { return repeated_at_; }

 private:
  // A container open around the parser: where it is in the document, the keys it gave, and
  // where the parser is in it now.
  struct Open {
    Json* value = nullptr;
    bool array = false;
    std::set<std::string> keys;
    std::string key;
    std::size_t index = 0;
  };

  // The value read at the current place: the root, the next element of the open array, or the
  // member of the open object named by the last key (appended: a key given twice is refused).
  Json& place(Json value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return root_;
    }
    Open& container = open_.back();
    if (container.array) {
      auto& elements = container.value->template get_ref<typename Json::array_t&>();
      elements.push_back(std::move(value));
      return elements.back();
    }
    auto& members = container.value->template get_ref<typename Json::object_t&>();
    if constexpr (AppendsInOrder<typename Json::object_t>::value) {
      members.emplace_back(container.key, std::move(value));  // an ordered object: keep the order given
      return members.back().second;
    } else {
      return members.insert_or_assign(container.key, std::move(value)).first->second;
    }
  }

  bool add(Json value) {
    place(std::move(value));
    element_done();
    return true;
  }

  bool open(Json value, bool array) {
    Json& opened = place(std::move(value));
    open_.push_back({&opened, array, {}, {}, 0});
    return true;
  }

  bool close() {
    open_.pop_back();
    element_done();
    return true;
  }

  // An element of the open array is read whole: the path names the next one from here on.
  void element_done() {
    if (!open_.empty() && open_.back().array) ++open_.back().index;
  }

  Json& root_;
  std::vector<Open> open_;
  std::string repeated_;
  std::string repeated_at_;
};

}  // namespace detail

// The document in `text` (as nlohmann::json or nlohmann::ordered_json); `refuse(path, problem)`
// is called, and must throw, when the text is not JSON, a number in it is too large for a double
// (1e400), or an object gives a key twice, with the problem said in words and `path` the value's
// JSON path ("$.regions[2].seconds"; "$" when the text is no JSON at all).
template <class Json = nlohmann::json, class Refuse>
Json parse_strict_json(std::string_view text, Refuse&& refuse) {
  Json root;
  detail::StrictBuilder<Json> builder(root);
  try {
    Json::sax_parse(text, &builder);
  } catch (const typename Json::parse_error& error) {
    refuse(std::string("$"), "not JSON (" + detail::json_error_words(error) + ")");
  } catch (const typename Json::out_of_range& error) {
    // The lexer read a number past a double's range; the path is the value being read.
    refuse(builder.path(builder.depth()),
           "is a number too large for a double (" + detail::json_error_words(error) + "); write a finite number");
  }
  if (!builder.repeated().empty()) {
    refuse(builder.repeated_at(), "the key '" + builder.repeated() + "' is given twice in one object; keep one");
  }
  return root;
}

}  // namespace remat::alloc
