#pragma once
// Errors remat-report turns into exit codes: a usage error exits 1, bad input and output that
// cannot be written exit 2.
// Messages are one line and say where (byte offset, line or JSON path) and what was wrong.

#include <stdexcept>
#include <string>

namespace remat::report {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 1;
inline constexpr int kExitBadInput = 2;

// The command line asked for something that cannot be done (unknown option value, missing -o).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The input file is unreadable, malformed or of the wrong kind. `where` is a byte offset,
// a line, or a JSON path such as `$.segments[3].blocks[0].size`.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
  InputError(const std::string& where, const std::string& message)
      : std::runtime_error(where.empty() ? message : where + ": " + message) {}
};

// An -o file cannot be written: its directory is missing, the disk is full, or the path names
// something remat-report must not replace (a device, a FIFO, an input of the same command).
class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Quotes text from a dump in a one-line message: control characters escaped as
// escape_controls() does (core/terminal_text.hpp), cut after `max_chars` bytes with "...".
std::string printable(std::string_view text, std::size_t max_chars = 60);

}  // namespace remat::report
