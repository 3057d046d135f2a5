#pragma once
// Reads one large JSON document a value at a time through one buffer: a caller walks the
// outer objects and arrays itself (`expect`, `peek`) and takes each inner value's raw text
// (`value`) to parse alone, so memory holds the largest single value, never the document.
// Values are delimited, not validated: whoever parses the text finds what is wrong inside it.
// Errors name the byte ("byte N: ..."); the caller puts the input's name in front.

#include "reader/input_file.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

class JsonValueScanner {
 public:
  explicit JsonValueScanner(InputFile input, std::size_t chunk_bytes = std::size_t{1} << 20);

  // Up to `max` of the next bytes, whitespace included, not consumed (fewer only at the end).
  std::string_view head(std::size_t max);
  // The next byte after whitespace, not consumed; '\0' at the end of the input.
  char peek();
  // Consumes `c` after whitespace; throws InputError "byte N: expected <what>" otherwise.
  void expect(char c, std::string_view what);
  // The raw text of the next value after whitespace (an object, array, string, number or
  // literal), consumed. Followed by simdjson::SIMDJSON_PADDING readable bytes; valid until the
  // next call. Throws InputError when the input ends inside it.
  std::string_view value();
  // Byte offset of the next unread byte (of the value `value` just returned, before the call).
  std::uint64_t position() const { return buffer_offset_ + begin_; }
  // What messages call the input.
  const std::string& name() const { return input_.name(); }

 private:
  // Makes at least one more byte available past `end_`, keeping [begin_, end_); false at the end.
  bool refill();
  // Index one past the value that starts at begin_, refilling as needed (begin_ may move).
  std::size_t value_end();
  [[noreturn]] void fail(std::uint64_t offset, const std::string& problem) const;

  InputFile input_;
  std::vector<char> buffer_;
  std::size_t chunk_ = 0;
  std::size_t begin_ = 0, end_ = 0;
  std::uint64_t buffer_offset_ = 0;  // input offset of buffer_[0]
  bool eof_ = false;
};

}  // namespace remat::report
