#pragma once
// Runs remat-report in-process on files written to a temporary directory, capturing its
// exit code, stdout and stderr.

#include "app/cli_app.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

namespace remat::report::testing {

struct CliResult {
  int code = 0;
  std::string out;
  std::string err;
};

inline CliResult run(const std::vector<std::string>& args) {
  std::vector<std::string> storage{"remat-report"};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  CliResult result;
  result.code = run_cli(static_cast<int>(argv.size()), argv.data());
  result.out = ::testing::internal::GetCapturedStdout();
  result.err = ::testing::internal::GetCapturedStderr();
  return result;
}

inline CliResult run(std::initializer_list<std::string> args) { return run(std::vector<std::string>(args)); }

// The committed fixtures in tests/cli/data.
inline std::string data_path(const std::string& name) { return std::string(REMAT_CLI_TEST_DATA) + "/" + name; }
inline std::string data_text(const std::string& name) {
  std::ifstream in(data_path(name), std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("remat-report-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& contents) const {
    const auto file = path_ / name;
    std::ofstream(file, std::ios::binary) << contents;
    return file.string();
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path path_;
};

// Every subcommand that reads a dump, with the arguments it needs besides the file (outputs go
// to `dir`).
inline std::vector<std::vector<std::string>> every_reading_command(const std::string& file, const TempDir& dir) {
  return {{"summary", file},
          {"memory", file},
          {"segments", file},
          {"trace", file},
          {"timeline", file, "-o", dir.path("timeline.svg")},
          {"diff", file, file},
          {"validate", file},
          {"export", file, "--to", "torch-snapshot", "-o", dir.path("export.pickle")}};
}

// Runs every reading subcommand on `file` and expects each to exit 2 with exactly `message`
// as its one line on stderr (`validate` prints it as "invalid: ...").
inline void expect_refused_by_every_command(const std::string& file, const TempDir& dir, const std::string& message) {
  for (const std::vector<std::string>& command : every_reading_command(file, dir)) {
    const CliResult r = run(command);
    EXPECT_EQ(r.code, 2) << command[0] << ": " << r.err;
    EXPECT_EQ(r.err, (command[0] == "validate" ? "invalid: " : "remat-report: ") + message + "\n") << command[0];
  }
}

// A valid trace: header plus the given event lines.
inline std::string trace_text(const std::vector<std::string>& events, const std::string& event_count = "null") {
  std::string text =
      R"({"kind":"trace","schema_version":1,"producer":"test","created_at":"2026-01-01T00:00:00Z","host":"h","pid":1,)"
      R"("rank":0,"device":0,"names":["","layers.0::attention","layers.1::mlp","site.a"],)"
      R"("tags":[{"region":0,"policy":"none","phase":"other","site":0,"recv":null},)"
      R"({"region":1,"policy":"save","phase":"forward","site":3,"recv":null},)"
      R"({"region":2,"policy":"recompute","phase":"backward","site":0,"recv":{"stage":1,"direction":"F","slot":2}}],)"
      R"("event_count":)" +
      event_count + "}\n";
  for (const std::string& e : events) text += e + "\n";
  return text;
}

inline std::string event(const std::string& action, long long time, unsigned long long address, unsigned long long size,
                         int tag, int stream = 0) {
  return R"({"action":")" + action + R"(","time_us":)" + std::to_string(time) + R"(,"address":)" +
         std::to_string(address) + R"(,"size":)" + std::to_string(size) + R"(,"stream":)" + std::to_string(stream) +
         R"(,"tag":)" + std::to_string(tag) + "}";
}

}  // namespace remat::report::testing
