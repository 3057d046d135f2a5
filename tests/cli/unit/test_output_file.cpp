// What -o may replace (timeline, export, import): a regular file or a new path, written whole;
// the file behind a symlink, keeping the link; never a FIFO, device, socket or directory, never
// one of the command's inputs. Failures exit 2 naming the path and the system's reason.
#include "cli_runner.hpp"
#include "output/output_file.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

namespace remat::report::testing {
namespace {

// The commands that write -o, each reading `input` (a snapshot, or for import a pickle).
std::vector<std::vector<std::string>> writing_commands(const std::string& snapshot, const std::string& pickle,
                                                       const std::string& out) {
  return {{"timeline", snapshot, "-o", out},
          {"export", snapshot, "--to", "torch-snapshot", "-o", out},
          {"import", pickle, "-o", out}};
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(OutputFile, AFifoIsRefusedAndLeftInPlace) {
  TempDir dir;
  const std::string fifo = dir.path("pipe.svg");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& command : writing_commands(data_path("snapshot-end.json"), data_path("torch-snapshot.pickle"), fifo)) {
    const CliResult r = run(command);
    EXPECT_EQ(r.code, 2) << command[0];
    EXPECT_EQ(r.err, "remat-report: -o " + fifo +
                         " is a FIFO (named pipe), which remat-report will not replace; name a regular file or a new "
                         "path\n")
        << command[0];
    struct stat info {};
    ASSERT_EQ(::lstat(fifo.c_str(), &info), 0);
    EXPECT_TRUE(S_ISFIFO(info.st_mode)) << command[0] << ": the FIFO was replaced";
  }
}

TEST(OutputFile, ADirectoryIsRefusedWithExitTwo) {
  TempDir dir;
  std::filesystem::create_directories(dir.path("out.svg"));
  const CliResult r = run({"timeline", data_path("snapshot-end.json"), "-o", dir.path("out.svg")});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: -o " + dir.path("out.svg") +
                       " is a directory, which remat-report will not replace; name a regular file or a new path\n");
}

TEST(OutputFile, ASymlinkKeepsItsLinkAndTheFileItPointsToIsReplaced) {
  TempDir dir;
  const std::string target = dir.write("target.svg", "old");
  ASSERT_EQ(::chmod(target.c_str(), 0640), 0);
  const std::string link = dir.path("link.svg");
  std::filesystem::create_symlink("target.svg", link);
  const CliResult r = run({"timeline", data_path("snapshot-end.json"), "-o", link});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(std::filesystem::read_symlink(link), "target.svg");
  EXPECT_EQ(file_text(target).rfind("<svg", 0), 0u) << file_text(target).substr(0, 40);
  struct stat info {};
  ASSERT_EQ(::stat(target.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0640u) << "the replaced file keeps its permission bits";
}

TEST(OutputFile, ADanglingSymlinkOrOneToAFifoIsRefused) {
  TempDir dir;
  const std::string dangling = dir.path("dangling.svg");
  std::filesystem::create_symlink("missing.svg", dangling);
  CliResult r = run({"timeline", data_path("snapshot-end.json"), "-o", dangling});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: -o " + dangling +
                       " is a symbolic link to a path that cannot be followed (No such file or directory); point it "
                       "at a file or name another output\n");
  EXPECT_FALSE(std::filesystem::exists(dir.path("missing.svg")));

  const std::string fifo = dir.path("pipe.svg");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string link = dir.path("to-pipe.svg");
  std::filesystem::create_symlink("pipe.svg", link);
  r = run({"timeline", data_path("snapshot-end.json"), "-o", link});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: -o " + link +
                       " is a symbolic link to a FIFO (named pipe), which remat-report will not replace; name a "
                       "regular file or a new path\n");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
}

TEST(OutputFile, AnOutputThatIsTheInputIsRefusedAndTheInputKept) {
  TempDir dir;
  const std::string snapshot = dir.write("victim.json", data_text("snapshot-end.json"));
  const std::string pickle = dir.write("victim.pickle", data_text("torch-snapshot.pickle"));
  const std::string svg = dir.write("t.svg", "<svg/>");
  for (const auto& [input, command] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {snapshot, {"export", snapshot, "--to", "torch-snapshot", "-o", snapshot}},
           {pickle, {"import", pickle, "-o", pickle}},
           {svg, {"timeline", svg, "-o", svg}}}) {
    const std::string before = file_text(input);
    const CliResult r = run(command);
    EXPECT_EQ(r.code, 2) << command[0];
    EXPECT_EQ(r.err, "remat-report: -o " + input + " is the same file as the input " + input +
                         ": writing it would destroy the input; name another output file\n")
        << command[0];
    EXPECT_EQ(file_text(input), before) << command[0] << ": the input was overwritten";
  }

  // The same file under another name (a symlink to it) is the same file.
  const std::string alias = dir.path("alias.json");
  std::filesystem::create_symlink("victim.json", alias);
  const CliResult r = run({"export", alias, "--to", "torch-snapshot", "-o", snapshot});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is the same file as the input " + alias), std::string::npos) << r.err;
}

TEST(OutputFile, DashIsRefusedAsAUsageErrorByEveryWritingCommand) {
  TempDir dir;
  for (const auto& command :
       writing_commands(data_path("snapshot-end.json"), data_path("torch-snapshot.pickle"), "-")) {
    const CliResult r = run(command);
    EXPECT_EQ(r.code, 1) << command[0];
    EXPECT_EQ(r.err, "remat-report " + command[0] +
                         ": -o -: this command writes its output to a file and its summary to standard output; name "
                         "an output file\n");
    EXPECT_FALSE(std::filesystem::exists("-")) << command[0] << " wrote a file named -";
  }
}

TEST(OutputFile, AnUnwritablePathExitsTwoNamingThePathAndTheReason) {
  for (const auto& command :
       writing_commands(data_path("snapshot-end.json"), data_path("torch-snapshot.pickle"), "/nonexistent/x.svg")) {
    const CliResult r = run(command);
    EXPECT_EQ(r.code, 2) << command[0];
    EXPECT_EQ(r.err,
              "remat-report: cannot write /nonexistent/x.svg: No such file or directory; pass -o a path in a directory "
              "you can write to\n")
        << command[0];
  }
}

TEST(OutputFile, AWriteThatFailsMidwayExitsTwoAndLeavesTheOldFile) {
  TempDir dir;
  const std::string out = dir.write("t.svg", "old");
  // A file size limit makes the write fail part way, as a full disk does (EFBIG, not ENOSPC).
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;  // the SVG is larger; the summary on (captured) stdout is not
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const CliResult r = run({"timeline", data_path("snapshot-end.json"), "-o", out});
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: cannot write " + out + ": File too large\n");
  EXPECT_EQ(file_text(out), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path("")), {}), 1) << "a temporary file was left";
}

TEST(OutputFile, ANewFileIsWrittenWhole) {
  TempDir dir;
  const CliResult r =
      run({"export", data_path("snapshot-end.json"), "--to", "torch-snapshot", "-o", dir.path("new.pickle")});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string pickle = file_text(dir.path("new.pickle"));
  ASSERT_GE(pickle.size(), 2u);
  EXPECT_EQ(pickle.substr(0, 2), "\x80\x02");  // a protocol-2 pickle from its first byte
  EXPECT_EQ(pickle.back(), '.');                // to its STOP opcode
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path("")), {}), 1) << "a temporary file was left";
}

// The temporary file needs no longer name than the target: a 250-byte name is valid (255 at most).
TEST(OutputFile, ATargetWithALongValidNameIsWritten) {
  TempDir dir;
  const std::string out = dir.path(std::string(242, 'p') + ".pickle");
  const CliResult r = run({"export", data_path("snapshot-end.json"), "--to", "torch-snapshot", "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(file_text(out).substr(0, 2), "\x80\x02");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path("")), {}), 1) << "a temporary file was left";
}

// A render stopped by SIGINT, SIGTERM or SIGHUP leaves no temporary file beside the output, the
// old file untouched, and the process still ends by that signal.
TEST(OutputFile, ASignalDuringAWriteRemovesTheTemporaryFile) {
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
    TempDir dir;
    const std::string out = dir.write("t.svg", "old");
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      OutputFileWriter writer(output_target(out, {}));
      writer.write("<svg>half");
      std::raise(signal);
      ::_exit(0);  // not reached: the signal ends the process
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal) << "signal " << signal << ", status " << status;
    EXPECT_EQ(file_text(out), "old");
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path("")), {}), 1)
        << "signal " << signal << ": a temporary file was left";
  }
}

// A signal the process ignores (nohup) stays ignored: the write goes on and commits.
TEST(OutputFile, AnIgnoredSignalStaysIgnored) {
  TempDir dir;
  const std::string out = dir.path("t.svg");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGHUP, SIG_IGN);
    OutputFileWriter writer(output_target(out, {}));
    writer.write("<svg/>");
    std::raise(SIGHUP);
    writer.commit();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(file_text(out), "<svg/>");
}

}  // namespace
}  // namespace remat::report::testing
