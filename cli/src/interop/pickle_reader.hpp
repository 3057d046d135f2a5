#pragma once
// Reads Python pickles (protocols 2 to 5) of plain data only. A pickle that would construct
// Python objects (GLOBAL, REDUCE, ...) is refused: importing never runs code.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace remat::report {

struct PyValue;
// Values live in the PickleDocument that read them (an arena), so shared and even cyclic
// references are plain pointers.
using PyRef = PyValue*;

struct PyValue {
  enum class Kind : std::uint8_t { none, boolean, integer, real, string, bytes, list, tuple, dict, set };
  Kind kind = Kind::none;
  bool boolean = false;
  std::int64_t integer = 0;
  // Python ints in [2^63, 2^64) (addresses and sizes near the top of the address space):
  // `integer` then holds their low 64 bits, and only unsigned fields may take them.
  bool above_int64 = false;
  double real = 0;
  std::string text;  // string (UTF-8) or bytes
  std::vector<PyRef> items;  // list, tuple, set
  std::vector<std::pair<PyRef, PyRef>> entries;  // dict, in insertion order

  // The value under string key `key` of a dict, or null.
  const PyValue* get(std::string_view key) const;
  bool is_number() const { return kind == Kind::integer || kind == Kind::boolean; }
  std::uint64_t unsigned_integer() const { return static_cast<std::uint64_t>(integer); }
};

struct PickleDocument {
  std::vector<std::unique_ptr<PyValue>> arena;
  const PyValue* root = nullptr;
};

// Throws InputError "byte N: ..." for malformed or unsupported pickles.
PickleDocument read_pickle(std::string_view bytes);

}  // namespace remat::report
