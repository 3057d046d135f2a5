#pragma once
// An input named on the command line: a file, or `-` for standard input. Pipes, FIFOs and
// other streams are read front to back once, like regular files; only their size is unknown.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace remat::report {

// The command-line name of standard input, and how messages call it.
inline constexpr std::string_view kStdinArgument = "-";
inline constexpr std::string_view kStdinName = "<stdin>";

class InputFile {
 public:
  // Opens `argument`; throws InputError for a missing, unreadable or directory path.
  static InputFile open(const std::string& argument);

  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  // The path, or "<stdin>": what messages call this input.
  const std::string& name() const { return name_; }
  // Bytes in a regular file; empty for streams.
  std::optional<std::uint64_t> size() const { return size_; }
  // Up to `max` bytes; 0 only at the end of the input. Throws InputError on a read error.
  std::size_t read(char* into, std::size_t max);

 private:
  InputFile(int fd, bool owned, std::string name, std::optional<std::uint64_t> size);

  int fd_ = -1;
  bool owned_ = false;
  std::string name_;
  std::optional<std::uint64_t> size_;
};

// Whether two input arguments name one stream (standard input, a pipe, a FIFO), which holds
// one dump and can be read once: `-` and /dev/stdin, or a FIFO named twice. A regular file
// named twice is read twice and is not one stream.
bool same_stream(const std::string& a, const std::string& b);

// Sees the first bytes of an input (up to kSniffBytes, fewer only when the input is shorter) and
// its name before the rest is read, so that a wrong input is refused in bounded memory.
using HeadCheck = std::function<void(std::string_view head, const std::string& name)>;

// Reads a whole input (`-` for standard input) into memory: for binary inputs such as pickles.
// `check_head` sees its first bytes. A missing, unreadable or empty input is an InputError.
std::string read_whole_input(const std::string& argument, const HeadCheck& check_head);

// Reads a whole small input (`-` for standard input) as text: a schedule CSV.
// A missing, unreadable or directory input, or one past `largest` bytes (counted as it is read,
// so that a stream is bounded too), is an InputError that names `kind` ("a region profile") and
// ends with what to pass instead (`pass`: "a region-profile dump (profile.to_json(path))").
// `check_head`, when given, sees the first bytes before the rest is read.
std::string read_text_input(const std::string& argument, std::uint64_t largest, std::string_view kind,
                            std::string_view pass, const HeadCheck& check_head = nullptr);

// read_text_input for a small JSON dump (a region or stage profile, a prediction), whose start is
// checked as every dump reader checks it: an empty input, NUL bytes, a byte-order mark, an
// archive or a pickle is refused before the rest is read (refuse_non_json_start), and text that
// is only whitespace or does not start with '{' once it is read, or whose JSON syntax is broken (a
// file cut short is said to be).
std::string read_json_text_input(const std::string& argument, std::uint64_t largest, std::string_view kind,
                                 std::string_view pass);

}  // namespace remat::report
