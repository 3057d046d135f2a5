#pragma once
// Reads an input line by line through one buffer, so memory stays flat however large the
// input is; the buffer grows only for a line longer than it. Every line handed out is
// followed by simdjson::SIMDJSON_PADDING readable bytes.
//
// Dumps are JSON text, which never holds a NUL byte: a line containing one is an InputError
// naming its offset, raised before the line is buffered whole (a zero-filled file of any
// size is refused in bounded memory).

#include "reader/input_file.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

// The most of one line, or of a document read with read_rest(), a stream (standard input, a pipe)
// may hold: a regular file is bounded by its size, a stream by this. As `advise` caps a profile.
inline constexpr std::size_t kLargestStreamBuffer = std::size_t{256} << 20;

class LineReader {
 public:
  explicit LineReader(InputFile input, std::size_t chunk_bytes = std::size_t{8} << 20);

  // Up to `max` of the next bytes, without consuming them (fewer only at the end of the input).
  std::string_view peek(std::size_t max);
  // Consumes spaces, tabs, CRs and newlines (counting lines); false when nothing else follows.
  bool skip_whitespace();
  // The next line without its '\n' (and without a trailing '\r'); false at the end of the input.
  bool next(std::string_view& line);
  // Hands out the line `next` just returned once more.
  void unread();
  // Everything from the next unread byte to the end of the input, held in this reader until
  // its next call; followed by padding. For one JSON document spread over many lines.
  std::string_view read_rest();
  // Everything from the next unread byte to the end of the input as raw bytes, NUL bytes
  // included: for a binary input (a pickle) that peek() recognised.
  std::string read_binary_rest();

  // Byte offset of the last line returned (or of the text read_rest returned), and its
  // 1-based line number.
  std::uint64_t line_offset() const { return line_offset_; }
  std::uint64_t line_number() const { return line_number_; }
  // Byte offset of the next unread byte.
  std::uint64_t position() const { return offset_of(begin_); }
  // What messages call the input: its path, or "<stdin>".
  const std::string& name() const { return input_.name(); }

 private:
  bool refill();
  void grow();
  std::uint64_t offset_of(std::size_t index) const { return buffer_offset_ + index; }
  [[noreturn]] void nul_byte() const;

  InputFile input_;
  std::vector<char> buffer_;
  std::size_t capacity_ = 0;  // usable bytes; padding follows
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  std::size_t last_begin_ = 0;       // where the line `next` returned began, for unread
  std::uint64_t buffer_offset_ = 0;  // input offset of buffer_[0]
  std::uint64_t line_offset_ = 0;
  std::uint64_t line_number_ = 0;
  std::uint64_t first_nul_ = UINT64_MAX;  // input offset of the first NUL byte read, if any
  bool eof_ = false;
};

}  // namespace remat::report
