#pragma once
// Reads a file line by line through one bounded buffer, so memory stays flat however large
// the file is. Every line handed out is followed by simdjson::SIMDJSON_PADDING readable bytes.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

class LineReader {
 public:
  explicit LineReader(const std::string& path, std::size_t chunk_bytes = std::size_t{8} << 20);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\n' (and without a trailing '\r'); false at the end of the file.
  bool next(std::string_view& line);
  // Byte offset of the last line returned, and its 1-based number.
  std::uint64_t line_offset() const { return line_offset_; }
  std::uint64_t line_number() const { return line_number_; }
  std::uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  bool refill();

  std::string path_;
  int fd_ = -1;
  std::vector<char> buffer_;
  std::size_t capacity_ = 0;  // usable bytes; padding follows
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  std::uint64_t buffer_offset_ = 0;  // file offset of buffer_[0]
  std::uint64_t line_offset_ = 0;
  std::uint64_t line_number_ = 0;
  std::uint64_t file_size_ = 0;
  bool eof_ = false;
};

}  // namespace remat::report
