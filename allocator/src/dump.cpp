#include <remat/alloc/dump.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/utc_time.hpp>
#include <remat/alloc/version.hpp>

#include "message_text.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace remat::alloc {
namespace {

// The job rank from the usual launcher variables (RANK, then SLURM_PROCID, then
// OMPI_COMM_WORLD_RANK), or 0.
int launcher_rank() {
  for (const char* name : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(text, &end, 10);
    if (*end == '\0' && rank >= 0 && rank < (1L << 30)) return static_cast<int>(rank);
  }
  return 0;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

[[noreturn]] void io_failure(const std::string& what, const std::string& path, int error) {
  throw IoError("cannot write " + detail::quote(path, 256) + ": " + what + " failed (" + std::strerror(error) +
                "); pass a path in an existing directory you can write to");
}

std::string_view file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The file a dump replaces: `path`, or what a symbolic link at `path` points to (the link is
// kept). A dump is renamed into place, which would replace a device, FIFO or socket itself
// (as root, /dev/null), so anything but a regular file or a new name is refused.
std::string dump_target(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return path;  // a new file; open() reports a bad directory
  std::string target = path;
  if (S_ISLNK(info.st_mode)) {
    char* resolved = ::realpath(path.c_str(), nullptr);
    if (resolved == nullptr) {
      throw IoError("cannot write " + detail::quote(path, 256) + ": it is a symbolic link that cannot be followed (" +
                    std::strerror(errno) + "); point it at a file in an existing directory, or pass another path");
    }
    target = resolved;
    std::free(resolved);
    if (::stat(target.c_str(), &info) != 0) return target;
  }
  if (!S_ISREG(info.st_mode)) {
    throw IoError("cannot write " + detail::quote(path, 256) + ": it is " + std::string(file_kind(info.st_mode)) +
                  ", and a dump replaces its target with a new file; pass the path of a regular file");
  }
  return target;
}

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

DumpHeader current_dump_header() {
  return {std::string("remat ") + kVersion, utc_text(now_us(), false), host_name(),
          static_cast<std::int64_t>(::getpid()), launcher_rank()};
}

void write_dump_header(JsonWriter& json, std::string_view kind, int schema_version, int device) {
  const DumpHeader header = current_dump_header();
  json.field("kind", kind)
      .field("schema_version", schema_version)
      .field("producer", header.producer)
      .field("created_at", header.created_at)
      .field("host", header.host)
      .field("pid", header.pid)
      .field("rank", header.rank)
      .field("device", device);
}

void write_file_atomically(const std::string& requested_path, std::string_view contents) {
  if (requested_path.empty()) throw IoError("dump path is empty; pass the path of the file to write");
  if (requested_path.find('\0') != std::string::npos) {
    throw IoError("dump path " + detail::quote(requested_path, 256) +
                  " holds a NUL character, where the system would cut it; pass a path without one");
  }
  const std::string path = dump_target(requested_path);
  static std::atomic<unsigned> counter{0};
  // A short name beside the target, so that any name the file system accepts for the target
  // also leaves room for the temporary file's.
  std::string temp = directory_of(path);
  if (temp.back() != '/') temp += '/';
  temp += ".remat-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) io_failure("creating the temporary file " + temp, path, errno);
  const char* data = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(temp.c_str());
      io_failure("writing", path, error);
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    io_failure("fsync", path, error);
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    io_failure("renaming into place", path, error);
  }
  // Make the rename itself durable.
  const int dir = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace remat::alloc
