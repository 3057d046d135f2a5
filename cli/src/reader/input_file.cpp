#include "reader/input_file.hpp"

#include "core/errors.hpp"
#include "reader/input_sniff.hpp"
#include "reader/json_document.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>

namespace remat::report {

InputFile InputFile::open(const std::string& argument) {
  const bool standard_input = argument == kStdinArgument;
  const std::string name = standard_input ? std::string(kStdinName) : argument;
  const int fd = standard_input ? STDIN_FILENO : ::open(argument.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("cannot open {}: {}", name, std::strerror(errno)));
  InputFile input(fd, !standard_input, name, std::nullopt);
  struct stat info {};
  if (::fstat(fd, &info) != 0) throw InputError(fmt::format("cannot read {}: {}", name, std::strerror(errno)));
  if (S_ISDIR(info.st_mode)) throw InputError(fmt::format("{} is a directory; pass a dump file inside it", name));
  if (S_ISREG(info.st_mode)) {
    input.size_ = static_cast<std::uint64_t>(info.st_size);
#ifdef POSIX_FADV_SEQUENTIAL
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  }
  return input;
}

InputFile::InputFile(int fd, bool owned, std::string name, std::optional<std::uint64_t> size)
    : fd_(fd), owned_(owned), name_(std::move(name)), size_(size) {}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(other.fd_), owned_(other.owned_), name_(std::move(other.name_)), size_(other.size_) {
  other.fd_ = -1;
  other.owned_ = false;
}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (owned_ && fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    owned_ = other.owned_;
    name_ = std::move(other.name_);
    size_ = other.size_;
    other.fd_ = -1;
    other.owned_ = false;
  }
  return *this;
}

InputFile::~InputFile() {
  if (owned_ && fd_ >= 0) ::close(fd_);
}

std::size_t InputFile::read(char* into, std::size_t max) {
  for (;;) {
    const ssize_t n = ::read(fd_, into, max);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) throw InputError(fmt::format("cannot read {}: {}", name_, std::strerror(errno)));
  }
}

namespace {
bool stat_input(const std::string& argument, struct stat& info) {
  return argument == kStdinArgument ? ::fstat(STDIN_FILENO, &info) == 0 : ::stat(argument.c_str(), &info) == 0;
}
}  // namespace

bool same_stream(const std::string& a, const std::string& b) {
  if (a == kStdinArgument && b == kStdinArgument) return true;
  struct stat first {
  }, second{};
  if (!stat_input(a, first) || !stat_input(b, second)) return false;
  return first.st_dev == second.st_dev && first.st_ino == second.st_ino && !S_ISREG(first.st_mode);
}

std::string read_whole_input(const std::string& argument, const HeadCheck& check_head) {
  InputFile input = InputFile::open(argument);
  std::string bytes(kSniffBytes, '\0');
  std::size_t used = 0;
  while (used < kSniffBytes) {
    const std::size_t n = input.read(bytes.data() + used, kSniffBytes - used);
    if (n == 0) break;
    used += n;
  }
  if (used == 0) throw InputError(fmt::format("{}: file is empty (0 bytes)", input.name()));
  check_head(std::string_view(bytes.data(), used), input.name());
  if (used == kSniffBytes) {
    bytes.resize(input.size() ? std::max<std::size_t>(static_cast<std::size_t>(*input.size()) + 1, 2 * kSniffBytes)
                              : std::size_t{1} << 20);
    for (;;) {
      if (used == bytes.size()) bytes.resize(bytes.size() * 2);
      const std::size_t n = input.read(bytes.data() + used, bytes.size() - used);
      if (n == 0) break;
      used += n;
    }
  }
  bytes.resize(used);
  return bytes;
}

namespace {
// What messages call a small text input.
std::string text_input_name(const std::string& argument) {
  return argument == kStdinArgument ? std::string(kStdinName) : printable(argument);
}
}  // namespace

std::string read_text_input(const std::string& argument, std::uint64_t largest, std::string_view kind,
                            std::string_view pass, const HeadCheck& check_head) {
  const bool standard_input = argument == kStdinArgument;
  const std::string name = text_input_name(argument);
  const int fd = standard_input ? STDIN_FILENO : ::open(argument.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("cannot read {}: {}; pass {}", name, std::strerror(errno), pass));
  struct Closer {
    int fd;
    bool owned;
    ~Closer() {
      if (owned) ::close(fd);
    }
  } closer{fd, !standard_input};
  struct stat info {};
  if (::fstat(fd, &info) == 0 && S_ISDIR(info.st_mode)) {
    throw InputError(fmt::format("{} is a directory; pass {}", name, pass));
  }
  if (S_ISREG(info.st_mode) && static_cast<std::uint64_t>(info.st_size) > largest) {
    throw InputError(fmt::format("{} is {} bytes, more than {} holds; pass {}", name, info.st_size, kind, pass));
  }
  std::string text;
  bool head_checked = !check_head;
  auto check_head_once = [&] {
    if (head_checked) return;
    head_checked = true;
    check_head(std::string_view(text).substr(0, kSniffBytes), name);
  };
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(fmt::format("cannot read {}: {}; pass {}", name, std::strerror(errno), pass));
    if (n == 0) {
      check_head_once();
      return text;
    }
    if (text.size() + static_cast<std::size_t>(n) > largest) {
      throw InputError(
          fmt::format("{} holds more than {} bytes, more than {} holds; pass {}", name, largest, kind, pass));
    }
    text.append(chunk, static_cast<std::size_t>(n));
    if (text.size() >= kSniffBytes) check_head_once();
  }
}

std::string read_json_text_input(const std::string& argument, std::uint64_t largest, std::string_view kind,
                                 std::string_view pass) {
  std::string text = read_text_input(argument, largest, kind, pass, refuse_non_json_start);
  refuse_non_object_text(text, text_input_name(argument));
  // The document's own reader (remat's profile and plan readers) words syntax errors its own way.
  if (std::optional<std::string> syntax = find_json_syntax_error(text)) {
    throw InputError(text_input_name(argument), *syntax);
  }
  return text;
}

}  // namespace remat::report
