#include "reader/line_reader.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace remat::report {

LineReader::LineReader(const std::string& path, std::size_t chunk_bytes) : path_(path), capacity_(chunk_bytes) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InputError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd_);
    throw InputError(fmt::format("{} is not a regular file", path));
  }
  file_size_ = static_cast<std::uint64_t>(info.st_size);
  if (file_size_ == 0) {
    ::close(fd_);
    throw InputError(fmt::format("{}: file is empty (0 bytes); expected a remat JSON dump", path));
  }
#ifdef POSIX_FADV_SEQUENTIAL
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  buffer_.resize(capacity_ + simdjson::SIMDJSON_PADDING);
}

LineReader::~LineReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool LineReader::refill() {
  if (eof_) return false;
  // Keep the unfinished line; move it to the front, growing the buffer for a line longer
  // than it (the header line of a trace with many names).
  const std::size_t kept = end_ - begin_;
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, kept);
    buffer_offset_ += begin_;
    begin_ = 0;
    end_ = kept;
  }
  if (end_ == capacity_) {
    capacity_ *= 2;
    buffer_.resize(capacity_ + simdjson::SIMDJSON_PADDING);
  }
  for (;;) {
    const ssize_t n = ::read(fd_, buffer_.data() + end_, capacity_ - end_);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(fmt::format("cannot read {}: {}", path_, std::strerror(errno)));
    if (n == 0) {
      eof_ = true;
      return kept > 0;
    }
    end_ += static_cast<std::size_t>(n);
    std::memset(buffer_.data() + end_, 0, simdjson::SIMDJSON_PADDING);
    return true;
  }
}

bool LineReader::next(std::string_view& line) {
  for (;;) {
    const char* start = buffer_.data() + begin_;
    const void* newline = std::memchr(start, '\n', end_ - begin_);
    if (newline != nullptr || (eof_ && end_ > begin_)) {
      const char* stop = newline != nullptr ? static_cast<const char*>(newline) : buffer_.data() + end_;
      std::size_t length = static_cast<std::size_t>(stop - start);
      line_offset_ = buffer_offset_ + begin_;
      ++line_number_;
      begin_ += length + (newline != nullptr ? 1 : 0);
      if (length > 0 && start[length - 1] == '\r') --length;
      line = std::string_view(start, length);
      return true;
    }
    if (eof_) return false;
    if (!refill() && end_ == begin_) return false;
  }
}

}  // namespace remat::report
