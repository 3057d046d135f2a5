#pragma once
// The process's own memory figures from /proc/self/status, for tests that bound them.

#include <cstdint>
#include <fstream>
#include <string>

namespace remat::testing {

// The value of `key` ("VmSize", "VmRSS", ...) in KiB, or -1 when the line is missing.
inline std::int64_t process_status_kib(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 && line[key.size()] == ':') {
      return std::stoll(line.substr(key.size() + 1));
    }
  }
  return -1;
}

inline std::int64_t process_status_mib(const std::string& key) { return process_status_kib(key) / 1024; }

}  // namespace remat::testing
