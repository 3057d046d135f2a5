#include "reader/json_value_scanner.hpp"

#include "core/errors.hpp"

#include <simdjson.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace remat::report {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool ends_scalar(char c) { return is_space(c) || c == ',' || c == '}' || c == ']' || c == ':'; }

}  // namespace

JsonValueScanner::JsonValueScanner(InputFile input, std::size_t chunk_bytes)
    : input_(std::move(input)), buffer_(chunk_bytes + simdjson::SIMDJSON_PADDING), chunk_(chunk_bytes) {}

void JsonValueScanner::fail(std::uint64_t offset, const std::string& problem) const {
  throw InputError(fmt::format("byte {}", offset), problem);
}

bool JsonValueScanner::refill() {
  if (eof_) return false;
  if (begin_ > 0) {  // keep only what is still wanted, at the front
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    buffer_offset_ += begin_;
    end_ -= begin_;
    begin_ = 0;
  }
  if (buffer_.size() - simdjson::SIMDJSON_PADDING - end_ < chunk_ / 2) {  // one value fills the buffer: grow
    buffer_.resize((buffer_.size() - simdjson::SIMDJSON_PADDING) * 2 + simdjson::SIMDJSON_PADDING);
  }
  const std::size_t n = input_.read(buffer_.data() + end_, buffer_.size() - simdjson::SIMDJSON_PADDING - end_);
  if (n == 0) {
    eof_ = true;
    return false;
  }
  if (std::memchr(buffer_.data() + end_, 0, n) != nullptr) {
    const auto* nul = static_cast<const char*>(std::memchr(buffer_.data() + end_, 0, n));
    fail(buffer_offset_ + static_cast<std::uint64_t>(nul - buffer_.data()),
         "NUL byte: a JSON dump is text and never holds one (a binary, truncated or zero-filled file?)");
  }
  end_ += n;
  return true;
}

std::string_view JsonValueScanner::head(std::size_t max) {
  while (end_ - begin_ < max && refill()) {
  }
  return {buffer_.data() + begin_, std::min(max, end_ - begin_)};
}

char JsonValueScanner::peek() {
  for (;;) {
    while (begin_ < end_ && is_space(buffer_[begin_])) ++begin_;
    if (begin_ < end_) return buffer_[begin_];
    if (!refill()) return '\0';
  }
}

void JsonValueScanner::expect(char c, std::string_view what) {
  const char next = peek();
  if (next != c) {
    fail(position(), next == '\0' ? fmt::format("the input ends where {} was expected: the file is cut short", what)
                                  : fmt::format("expected {}, found '{}'", what, next));
  }
  ++begin_;
}

std::size_t JsonValueScanner::value_end() {
  std::size_t i = begin_;
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  const char first = buffer_[begin_];
  const bool scalar = first != '{' && first != '[' && first != '"';
  for (;;) {
    for (; i < end_; ++i) {
      const char c = buffer_[i];
      if (scalar) {
        if (ends_scalar(c)) return i;
        continue;
      }
      if (in_string) {
        if (escaped) escaped = false;
        else if (c == '\\') escaped = true;
        else if (c == '"') {
          in_string = false;
          if (depth == 0) return i + 1;
        }
        continue;
      }
      if (c == '"') in_string = true;
      else if (c == '{' || c == '[') ++depth;
      else if ((c == '}' || c == ']') && --depth == 0) return i + 1;
    }
    const std::size_t scanned = i - begin_;
    if (!refill()) {
      if (scalar) return end_;
      fail(position(), "the input ends inside this value: the file is cut short (a job killed mid-write?)");
    }
    i = begin_ + scanned;
  }
}

std::string_view JsonValueScanner::value() {
  if (peek() == '\0') fail(position(), "the input ends where a value was expected: the file is cut short");
  const std::size_t end = value_end();
  const std::string_view text(buffer_.data() + begin_, end - begin_);
  begin_ = end;
  return text;
}

}  // namespace remat::report
