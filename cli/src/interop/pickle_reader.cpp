#include "interop/pickle_reader.hpp"

#include "core/errors.hpp"
#include "reader/json_document.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace remat::report {

const PyValue* PyValue::get(std::string_view key) const {
  if (kind != Kind::dict) return nullptr;
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::string && k->text == key) return v;
  }
  return nullptr;
}

namespace {

class Unpickler {
 public:
  Unpickler(std::string_view bytes, PickleDocument& document) : data_(bytes), document_(document) {}

  PyRef run() {
    for (;;) {
      if (pos_ >= data_.size()) fail(pos_, "pickle ends without a STOP opcode (truncated file?)");
      const std::size_t at = pos_;
      const auto code = static_cast<std::uint8_t>(data_[pos_++]);
      switch (code) {
        case 0x80: take(1); break;            // PROTO
        case 0x95: take(8); break;            // FRAME
        case '.': {                           // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail(at, "STOP with a malformed stack");
          return stack_.back();
        }
        case 'N': push(make(PyValue::Kind::none)); break;
        case 0x88: case 0x89: {
          PyRef v = make(PyValue::Kind::boolean);
          v->boolean = code == 0x88;
          push(v);
          break;
        }
        case 'J': push_int(static_cast<std::int32_t>(le(take(4), 4))); break;
        case 'K': push_int(static_cast<std::int64_t>(le(take(1), 1))); break;
        case 'M': push_int(static_cast<std::int64_t>(le(take(2), 2))); break;
        case 0x8a: case 0x8b: {  // LONG1, LONG4
          const std::size_t n = code == 0x8a ? le(take(1), 1) : le(take(4), 4);
          const char* p = take(n);
          // Nine bytes whose last is 0 hold a non-negative value below 2^64 (Python adds the
          // zero byte to keep the sign of values from 2^63 up).
          const bool unsigned_64 = n == 9 && p[8] == 0;
          if (n > 8 && !unsigned_64) {
            fail(at, fmt::format("integer of {} bytes does not fit in 64 bits (the largest accepted is 2^64 - 1, the "
                                 "smallest -2^63)",
                                 n));
          }
          const std::size_t width = std::min<std::size_t>(n, 8);
          std::uint64_t v = 0;
          for (std::size_t i = 0; i < width; ++i) {
            v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
          }
          if (n > 0 && n < 8 && (static_cast<unsigned char>(p[n - 1]) & 0x80)) v |= ~std::uint64_t{0} << (8 * n);
          push_int(static_cast<std::int64_t>(v));
          stack_.back()->above_int64 = unsigned_64 && v > static_cast<std::uint64_t>(INT64_MAX);
          break;
        }
        case 'G': {
          const char* p = take(8);
          std::uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(p[i]);
          PyRef v = make(PyValue::Kind::real);
          std::memcpy(&v->real, &bits, sizeof bits);
          push(v);
          break;
        }
        case 0x8c: push_text(at, le(take(1), 1), PyValue::Kind::string); break;
        case 'X': push_text(at, le(take(4), 4), PyValue::Kind::string); break;
        case 0x8d: push_text(at, le(take(8), 8), PyValue::Kind::string); break;
        case 'C': push_text(at, le(take(1), 1), PyValue::Kind::bytes); break;
        case 'B': push_text(at, le(take(4), 4), PyValue::Kind::bytes); break;
        case 0x8e: push_text(at, le(take(8), 8), PyValue::Kind::bytes); break;
        case '}': push(make(PyValue::Kind::dict)); break;
        case ']': push(make(PyValue::Kind::list)); break;
        case ')': push(make(PyValue::Kind::tuple)); break;
        case 0x8f: push(make(PyValue::Kind::set)); break;
        case '(': marks_.push_back(stack_.size()); break;
        case 'a': {
          PyRef item = pop(at);
          container(at, PyValue::Kind::list)->items.push_back(item);
          break;
        }
        case 'e': case 0x90: {  // APPENDS, ADDITEMS
          std::vector<PyRef> items = pop_mark(at);
          PyValue* target = container(at, code == 'e' ? PyValue::Kind::list : PyValue::Kind::set);
          target->items.insert(target->items.end(), items.begin(), items.end());
          break;
        }
        case 's': {
          PyRef value = pop(at);
          PyRef key = pop(at);
          container(at, PyValue::Kind::dict)->entries.emplace_back(key, value);
          break;
        }
        case 'u': {
          std::vector<PyRef> items = pop_mark(at);
          if (items.size() % 2 != 0) fail(at, "SETITEMS with an odd number of items");
          PyValue* dict = container(at, PyValue::Kind::dict);
          for (std::size_t i = 0; i < items.size(); i += 2) dict->entries.emplace_back(items[i], items[i + 1]);
          break;
        }
        case 't': case 'l': case 0x91: {  // TUPLE, LIST, FROZENSET
          PyRef v = make(code == 'l' ? PyValue::Kind::list : code == 't' ? PyValue::Kind::tuple : PyValue::Kind::set);
          v->items = pop_mark(at);
          push(v);
          break;
        }
        case 'd': {
          std::vector<PyRef> items = pop_mark(at);
          if (items.size() % 2 != 0) fail(at, "DICT with an odd number of items");
          PyRef v = make(PyValue::Kind::dict);
          for (std::size_t i = 0; i < items.size(); i += 2) v->entries.emplace_back(items[i], items[i + 1]);
          push(v);
          break;
        }
        case 0x85: case 0x86: case 0x87: {
          const std::size_t n = code - 0x84u;
          PyRef v = make(PyValue::Kind::tuple);
          if (stack_.size() < n + floor()) fail(at, "tuple of more items than the stack holds");
          v->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(v);
          break;
        }
        case 0x94: memo_[memo_.size()] = top(at); break;  // MEMOIZE
        case 'q': memo_[le(take(1), 1)] = top(at); break;
        case 'r': memo_[le(take(4), 4)] = top(at); break;
        case 'h': case 'j': {
          const std::uint64_t id = code == 'h' ? le(take(1), 1) : le(take(4), 4);
          const auto it = memo_.find(id);
          if (it == memo_.end()) fail(at, fmt::format("memo reference {} was never stored", id));
          push(it->second);
          break;
        }
        case '0': pop(at); break;
        case '1': pop_mark(at); break;
        case '2': push(top(at)); break;
        case 'c': case 0x93: case 'R': case 0x81: case 0x92: case 'b': case 'i': case 'o':
          fail(at, fmt::format("opcode 0x{:02x} builds a Python object; only plain data (dicts, lists, strings, numbers) "
                               "can be imported",
                               code));
        default: fail(at, fmt::format("unsupported or invalid pickle opcode 0x{:02x}", code));
      }
    }
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& message) const {
    throw InputError(fmt::format("byte {}", at), message);
  }
  const char* take(std::size_t n) {
    if (n > data_.size() - pos_) fail(pos_, fmt::format("pickle ends inside a value (needs {} more bytes)", n));
    const char* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  static std::uint64_t le(const char* p, std::size_t n) {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    return v;
  }
  PyRef make(PyValue::Kind kind) {
    if (document_.arena.size() >= kMaxValues) fail(pos_, "pickle holds more values than remat-report accepts");
    document_.arena.push_back(std::make_unique<PyValue>());
    PyRef v = document_.arena.back().get();
    v->kind = kind;
    return v;
  }
  static constexpr std::size_t kMaxValues = std::size_t{1} << 28;
  void push(PyRef v) { stack_.push_back(v); }
  void push_int(std::int64_t value) {
    PyRef v = make(PyValue::Kind::integer);
    v->integer = value;
    push(v);
  }
  void push_text(std::size_t at, std::uint64_t n, PyValue::Kind kind) {
    if (n > data_.size() - pos_) fail(at, fmt::format("string of {} bytes runs past the end of the file", n));
    PyRef v = make(kind);
    v->text.assign(take(n), n);
    if (kind == PyValue::Kind::string && find_invalid_utf8(v->text) != std::string::npos) {
      fail(at, "string is not valid UTF-8");
    }
    push(v);
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  PyRef pop(std::size_t at) {
    if (stack_.size() <= floor()) fail(at, "pops an empty stack");
    PyRef v = stack_.back();
    stack_.pop_back();
    return v;
  }
  const PyRef& top(std::size_t at) const {
    if (stack_.size() <= floor()) fail(at, "needs a value on the stack");
    return stack_.back();
  }
  std::vector<PyRef> pop_mark(std::size_t at) {
    if (marks_.empty()) fail(at, "needs a MARK that was never set");
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  PyValue* container(std::size_t at, PyValue::Kind kind) {
    const PyRef& target = top(at);
    if (target->kind != kind) fail(at, "adds items to a value of the wrong type");
    return target;
  }

  std::string_view data_;
  std::size_t pos_ = 0;
  std::vector<PyRef> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, PyRef> memo_;
  PickleDocument& document_;
};

}  // namespace

PickleDocument read_pickle(std::string_view bytes) {
  if (bytes.empty()) throw InputError("byte 0", "file is empty (0 bytes); expected a pickle");
  PickleDocument document;
  document.root = Unpickler(bytes, document).run();
  return document;
}

}  // namespace remat::report
