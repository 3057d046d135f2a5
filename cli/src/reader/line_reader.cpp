#include "reader/line_reader.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cstring>

namespace remat::report {

namespace {
constexpr std::size_t kBinaryChunk = std::size_t{1} << 20;
}  // namespace

LineReader::LineReader(InputFile input, std::size_t chunk_bytes) : input_(std::move(input)), capacity_(chunk_bytes) {
  if (const auto size = input_.size())
    capacity_ = static_cast<std::size_t>(std::min<std::uint64_t>(capacity_, *size + 1));
  capacity_ = std::max<std::size_t>(capacity_, 64);
  buffer_.resize(capacity_ + simdjson::SIMDJSON_PADDING);
}

void LineReader::nul_byte() const {
  throw InputError(fmt::format("{}: byte {}", name(), first_nul_),
                   "NUL byte: a JSON dump is text and never holds one (a binary, truncated or zero-filled file?)");
}

void LineReader::grow() {
  // A regular file's size bounds the growth: a line is never longer than what is left.
  std::size_t want = capacity_ * 2;
  if (const auto size = input_.size()) {
    const std::uint64_t left = *size > buffer_offset_ ? *size - buffer_offset_ : 0;
    want = static_cast<std::size_t>(std::min<std::uint64_t>(want, left + 1));
  } else if (want > kLargestStreamBuffer) {
    // A stream's size is unknown: without a bound, a document that never ends would fill memory.
    if (capacity_ >= kLargestStreamBuffer) {
      throw InputError(fmt::format("{}: byte {}", name(), offset_of(end_)),
                       fmt::format("more than {} MiB of one JSON document (or line) from a stream, which is held in "
                                   "memory whole: save the dump to a file and name the file, which is read in "
                                   "bounded memory",
                                   kLargestStreamBuffer >> 20));
    }
    want = kLargestStreamBuffer;
  }
  capacity_ = std::max(want, capacity_ + 1);
  buffer_.resize(capacity_ + simdjson::SIMDJSON_PADDING);
}

bool LineReader::refill() {
  if (eof_) return false;
  // Keep the unconsumed bytes; move them to the front, growing the buffer when they fill it.
  const std::size_t kept = end_ - begin_;
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, kept);
    buffer_offset_ += begin_;
    last_begin_ = last_begin_ >= begin_ ? last_begin_ - begin_ : 0;
    begin_ = 0;
    end_ = kept;
  }
  if (end_ == capacity_) grow();
  const std::size_t n = input_.read(buffer_.data() + end_, capacity_ - end_);
  if (n == 0) {
    eof_ = true;
    return false;
  }
  if (first_nul_ == UINT64_MAX) {
    if (const void* nul = std::memchr(buffer_.data() + end_, 0, n)) {
      first_nul_ = offset_of(static_cast<std::size_t>(static_cast<const char*>(nul) - buffer_.data()));
    }
  }
  end_ += n;
  std::memset(buffer_.data() + end_, 0, simdjson::SIMDJSON_PADDING);
  return true;
}

std::string_view LineReader::peek(std::size_t max) {
  while (end_ - begin_ < max && refill()) {
  }
  return {buffer_.data() + begin_, std::min(max, end_ - begin_)};
}

bool LineReader::skip_whitespace() {
  for (;;) {
    while (begin_ < end_) {
      const char c = buffer_[begin_];
      if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return true;
      if (c == '\n') ++line_number_;
      ++begin_;
    }
    if (!refill()) return false;
  }
}

bool LineReader::next(std::string_view& line) {
  std::size_t scanned = begin_;  // no newline before this index
  for (;;) {
    const char* newline = static_cast<const char*>(std::memchr(buffer_.data() + scanned, '\n', end_ - scanned));
    const std::size_t stop = newline != nullptr ? static_cast<std::size_t>(newline - buffer_.data()) : end_;
    if (first_nul_ >= offset_of(begin_) && first_nul_ < offset_of(stop)) nul_byte();
    if (newline != nullptr || (eof_ && end_ > begin_)) {
      std::size_t length = stop - begin_;
      const char* start = buffer_.data() + begin_;
      last_begin_ = begin_;
      line_offset_ = offset_of(begin_);
      ++line_number_;
      begin_ = stop + (newline != nullptr ? 1 : 0);
      if (length > 0 && start[length - 1] == '\r') --length;
      line = std::string_view(start, length);
      return true;
    }
    if (eof_) return false;
    const std::size_t done = end_ - begin_;
    if (!refill() && end_ == begin_) return false;
    scanned = begin_ + done;
  }
}

void LineReader::unread() {
  begin_ = last_begin_;
  --line_number_;
}

std::string_view LineReader::read_rest() {
  if (const auto size = input_.size(); size && *size > offset_of(end_)) {
    // One allocation for the whole rest of a regular file.
    const std::size_t want = static_cast<std::size_t>(*size - offset_of(begin_)) + 1;
    if (want > capacity_) {
      if (begin_ > 0) {
        std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
        buffer_offset_ += begin_;
        end_ -= begin_;
        begin_ = 0;
      }
      capacity_ = want;
      buffer_.resize(capacity_ + simdjson::SIMDJSON_PADDING);
    }
  }
  while (first_nul_ == UINT64_MAX && refill()) {
  }
  if (first_nul_ != UINT64_MAX && first_nul_ >= offset_of(begin_)) nul_byte();
  line_offset_ = offset_of(begin_);
  const std::string_view rest(buffer_.data() + begin_, end_ - begin_);
  begin_ = end_;
  return rest;
}

std::string LineReader::read_binary_rest() {
  std::string bytes(buffer_.data() + begin_, end_ - begin_);
  begin_ = end_;
  if (const auto size = input_.size(); size && *size > offset_of(end_)) bytes.reserve(static_cast<std::size_t>(*size - offset_of(begin_)) + bytes.size());
  std::size_t used = bytes.size();
  while (!eof_) {
    if (bytes.size() - used < kBinaryChunk) bytes.resize(used + std::max(kBinaryChunk, used));
    const std::size_t n = input_.read(bytes.data() + used, bytes.size() - used);
    if (n == 0) eof_ = true;
    used += n;
  }
  bytes.resize(used);
  return bytes;
}

}  // namespace remat::report
