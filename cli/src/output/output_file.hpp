#pragma once
// Files named by -o (timeline, export, import). They are written whole, through a temporary
// file in the same directory, fsync and a rename (the directory synced after it), so a reader
// never sees half a file and a failed write, or a crash, leaves the old one; SIGINT, SIGTERM and
// SIGHUP remove the temporary file (output/signal_cleanup.hpp). What -o names is checked before
// any input is read.

#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

struct OutputTarget {
  std::string argument;  // as given to -o, for messages
  std::string file;      // what is replaced: the argument, or the file a symlink there points to
};

// Checks -o `argument` and returns where to write. A symlink is followed, so the link stays
// and the file it points to is replaced. Refuses `-` (a UsageError: standard output carries the
// command's summary) and, as OutputError: an existing target that is not a regular file
// (directory, FIFO, device, socket), a dangling link, and a file that is one of `inputs`
// (paths, or `-` for standard input).
OutputTarget output_target(const std::string& argument, const std::vector<std::string>& inputs);

// Replaces the target with `contents`, keeping an existing file's permission bits; OutputError
// naming the path and the system's reason when it cannot.
void write_output_file(const OutputTarget& target, std::string_view contents);

// The same, the contents written piece by piece as a command makes them (`export` from a snapshot
// streaming by): the pieces go to the temporary file at once, and `commit` puts it in the target's
// place. A write that fails is not thrown until `commit`, with the message write_output_file gives,
// so that a command that refuses its input after it began writing says so first. A writer
// destroyed before `commit` removes its temporary file.
class OutputFileWriter {
 public:
  explicit OutputFileWriter(const OutputTarget& target);
  ~OutputFileWriter();
  OutputFileWriter(const OutputFileWriter&) = delete;
  OutputFileWriter& operator=(const OutputFileWriter&) = delete;

  void write(std::string_view piece);
  void commit();

 private:
  [[noreturn]] void fail(int error, std::string_view advice) const;
  void sync_directory() const;

  OutputTarget target_;
  std::string temp_;
  int fd_ = -1;
  int error_ = 0;       // the first failure's errno
  bool opened_ = true;  // the temporary file was created (a failure to create it has advice)
  bool watched_ = false;  // removed on SIGINT, SIGTERM and SIGHUP
};

}  // namespace remat::report
