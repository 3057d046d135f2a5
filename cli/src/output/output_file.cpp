#include "output/output_file.hpp"

#include "core/errors.hpp"
#include "output/signal_cleanup.hpp"
#include "reader/input_file.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace remat::report {

namespace {

std::string_view kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& argument, const std::string& problem) {
  throw OutputError(fmt::format("-o {} {}", argument, problem));
}

// The file a symlink at `argument` finally points to.
std::string link_target(const std::string& argument) {
  const std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(argument.c_str(), nullptr), &std::free);
  if (resolved == nullptr) {
    refuse(argument, fmt::format("is a symbolic link to a path that cannot be followed ({}); point it at a file or "
                                 "name another output",
                                 std::strerror(errno)));
  }
  return resolved.get();
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

}  // namespace

OutputTarget output_target(const std::string& argument, const std::vector<std::string>& inputs) {
  if (argument == kStdinArgument) {
    throw UsageError(
        "-o -: this command writes its output to a file and its summary to standard output; name an output file");
  }
  OutputTarget target{argument, argument};
  struct stat info {};
  if (::lstat(argument.c_str(), &info) != 0) return target;  // a new file, or a path open() will explain
  if (S_ISLNK(info.st_mode)) {
    target.file = link_target(argument);
    if (::stat(target.file.c_str(), &info) != 0) return target;
  }
  if (!S_ISREG(info.st_mode)) {
    refuse(argument, fmt::format("is {}{}, which remat-report will not replace; name a regular file or a new path",
                                 target.file == argument ? "" : "a symbolic link to ", kind_of(info.st_mode)));
  }
  for (const std::string& input : inputs) {
    struct stat input_info {};
    const bool found =
        input == kStdinArgument ? ::fstat(STDIN_FILENO, &input_info) == 0 : ::stat(input.c_str(), &input_info) == 0;
    if (found && same_file(info, input_info)) {
      const std::string name = input == kStdinArgument ? std::string(kStdinName) : input;
      refuse(argument, fmt::format("is the same file as the input {}: writing it would destroy the input; name another "
                                   "output file",
                                   name));
    }
  }
  return target;
}

OutputFileWriter::OutputFileWriter(const OutputTarget& target) : target_(target) {
  // A short name beside the target: any name the file system accepts for the target leaves
  // room for it.
  const auto slash = target.file.find_last_of('/');
  const std::string directory = slash == std::string::npos ? "." : target.file.substr(0, slash == 0 ? 1 : slash);
  temp_ = fmt::format("{}/.remat-report-{}.tmp", directory == "/" ? "" : directory, ::getpid());
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    error_ = errno;
    opened_ = false;
    return;
  }
  watched_ = remove_on_signal(temp_);
  struct stat existing {};
  if (::stat(target.file.c_str(), &existing) == 0 && ::fchmod(fd_, existing.st_mode & 07777) != 0) error_ = errno;
}

OutputFileWriter::~OutputFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (opened_) std::remove(temp_.c_str());
  if (watched_) forget_temporary_file();
}

void OutputFileWriter::fail(int error, std::string_view advice) const {
  throw OutputError(fmt::format("cannot write {}: {}{}", target_.argument, std::strerror(error), advice));
}

void OutputFileWriter::write(std::string_view piece) {
  for (std::size_t written = 0; error_ == 0 && written < piece.size();) {
    const ssize_t n = ::write(fd_, piece.data() + written, piece.size() - written);
    if (n >= 0)
      written += static_cast<std::size_t>(n);
    else if (errno != EINTR)
      error_ = errno;
  }
}

void OutputFileWriter::commit() {
  if (!opened_) fail(error_, "; pass -o a path in a directory you can write to");
  const int fd = fd_;
  fd_ = -1;
  // On disk before the rename: a crash after it leaves the new file whole, never an empty one.
  if (error_ == 0 && ::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) error_ = errno;
  if (::close(fd) != 0 && error_ == 0) error_ = errno;
  if (error_ == 0 && std::rename(temp_.c_str(), target_.file.c_str()) != 0) error_ = errno;
  if (error_ != 0) fail(error_, "");  // the destructor removes the temporary file
  opened_ = false;
  sync_directory();
}

void OutputFileWriter::sync_directory() const {
  // The rename itself is durable once the directory is; a file system that cannot say so is no failure.
  const auto slash = target_.file.find_last_of('/');
  const std::string directory = slash == std::string::npos ? "." : target_.file.substr(0, slash == 0 ? 1 : slash);
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

void write_output_file(const OutputTarget& target, std::string_view contents) {
  OutputFileWriter writer(target);
  writer.write(contents);
  writer.commit();
}

}  // namespace remat::report
