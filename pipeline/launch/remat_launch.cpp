// remat-launch: runs N ranks of a job on this machine, as torchrun does on one node. It
// opens the rendezvous port on 127.0.0.1 itself (a free one unless --master-port names one) and
// hands the listening socket to rank 0, so no other process can take the port in between (with
// --release-port it closes it instead, for programs that open the port themselves, as
// torch.distributed.init_process_group does);
// sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; prefixes
// every line a rank prints with "[rank i] "; and returns non-zero when any rank fails. When one
// rank fails the others get --grace seconds to fail on their own (they should: their transfers
// with it break) before they are stopped, and --timeout bounds the whole job. Each rank leads a
// process group, and the launcher stops whole groups, so what a rank started goes with it; a
// rank dies with the launcher even when the launcher is killed outright.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kUsageError = 2;
constexpr int kTimedOut = 124;
// A rank's output without a newline is forwarded in pieces of this size, each as a line of its
// own, so that a rank printing megabytes without one costs the launcher no more than this.
constexpr std::size_t kMaxLine = 65536;
// Once every rank has exited, processes they started that still hold their output get this
// long to finish writing before they are stopped: the job is over.
constexpr auto kLeftoverDrain = std::chrono::seconds(1);

struct Options {
  int nproc = 0;
  std::optional<int> master_port;
  double timeout_s = 0;  // 0: none
  double grace_s = 30;
  bool release_port = false;  // close the rendezvous socket before the ranks start (PyTorch's env://)
  std::vector<std::string> command;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr,
               "remat-launch: %s\n"
               "usage: remat-launch --nproc N [--master-port PORT] [--release-port] [--timeout SECONDS] "
               "[--grace SECONDS] [--] PROGRAM [ARGS...]\n",
               message.c_str());
  std::exit(kUsageError);
}

double parse_seconds(const std::string& flag, const std::string& text, double max) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !(value >= 0 && value <= max)) {
    usage_error(flag + " '" + text.substr(0, 64) + "' is not a number of seconds in 0.." +
                std::to_string(static_cast<long long>(max)));
  }
  return value;
}

// Counts and ports are whole numbers: "1.5" or "1e3" ranks would be a typo, not a request.
int parse_whole_number(const std::string& flag, const std::string& text, int min, int max) {
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end || value < min || value > max) {
    usage_error(flag + " '" + text.substr(0, 64) + "' is not a whole number in " + std::to_string(min) + ".." +
                std::to_string(max));
  }
  return value;
}

Options parse_options(int argc, char** argv) {
  Options options;
  int i = 1;
  auto value_of = [&](const std::string& flag) -> std::string {
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--nproc" || arg == "--nproc-per-node") {
      options.nproc = parse_whole_number(arg, value_of(arg), 1, 1024);
    } else if (arg == "--master-port") {
      options.master_port = parse_whole_number(arg, value_of(arg), 1, 65535);
    } else if (arg == "--timeout") {
      options.timeout_s = parse_seconds(arg, value_of(arg), 1e7);
    } else if (arg == "--grace") {
      options.grace_s = parse_seconds(arg, value_of(arg), 1e7);
    } else if (arg == "--release-port") {
      options.release_port = true;
    } else if (arg == "--help" || arg == "-h") {
      std::printf(
          "remat-launch --nproc N [--master-port PORT] [--release-port] [--timeout SECONDS] [--grace SECONDS]\n"
          "             [--] PROGRAM [ARGS...]\n"
          "  Runs N copies of PROGRAM as ranks 0..N-1 of one job on this machine, with the rendezvous store on\n"
          "  127.0.0.1 (a free port unless --master-port). Output lines are prefixed with the rank. When a rank\n"
          "  fails, the others are stopped after --grace seconds (default 30); --timeout stops the whole job\n"
          "  (exit status 124). The exit status is the first failing rank's (128+signal when killed).\n"
          "  The launcher holds the port and hands its socket to rank 0 (REMAT_MASTER_LISTEN_FD), which remat's\n"
          "  pipeline runtime serves the store on. --release-port closes it before the ranks start instead, for a\n"
          "  program that opens the port itself (torch.distributed.init_process_group, env://): as under\n"
          "  torchrun, another process may take the port in between.\n");
      std::exit(0);
    } else if (!arg.empty() && arg[0] == '-') {
      usage_error("unknown option " + arg.substr(0, 64));
    } else {
      break;
    }
  }
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  if (options.nproc == 0) usage_error("--nproc is required");
  if (options.command.empty()) usage_error("no program to run");
  return options;
}

// A listening socket on 127.0.0.1: `port`, or a free one the kernel picks.
int open_listener(std::optional<int> port, int& bound_port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) usage_error(std::string("cannot open a socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port.value_or(0)));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || ::listen(fd, 1024) != 0) {
    const int error = errno;
    if (error == EADDRINUSE) {
      usage_error("port " + std::to_string(*port) +
                  " on 127.0.0.1 is in use; choose another --master-port, or leave it out to use a free one");
    }
    usage_error("cannot listen on 127.0.0.1:" + std::to_string(port.value_or(0)) + ": " + std::strerror(error));
  }
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  bound_port = ntohs(address.sin_port);
  return fd;
}

struct Rank {
  int index = 0;
  pid_t pid = -1;
  int out_fd = -1;  // the rank's stdout, then stderr, read through pipes
  int err_fd = -1;
  std::string out_partial, err_partial;
  bool running = true;
  int status = 0;
};

// Written with fwrite, byte for byte: a rank's output may hold NUL bytes.
void write_line(FILE* sink, int rank, const char* text, std::size_t size) {
  std::fprintf(sink, "[rank %d] ", rank);
  std::fwrite(text, 1, size, sink);
  std::fputc('\n', sink);
}

// Forwards the complete lines of `partial` + `data`, keeping the unfinished end in `partial`
// (at most kMaxLine bytes; longer runs go out in pieces). Scans each byte once.
void forward_lines(int rank, std::string& partial, const char* data, std::size_t size, FILE* sink, bool flush_all) {
  const char* const end = data + size;
  while (data != end) {
    const char* newline = static_cast<const char*>(std::memchr(data, '\n', static_cast<std::size_t>(end - data)));
    const char* stop = newline != nullptr ? newline : end;
    const std::size_t room = kMaxLine - partial.size();
    if (static_cast<std::size_t>(stop - data) > room) {
      partial.append(data, room);
      write_line(sink, rank, partial.data(), partial.size());
      partial.clear();
      data += room;
      continue;
    }
    partial.append(data, stop);
    data = stop;
    if (newline == nullptr) break;
    write_line(sink, rank, partial.data(), partial.size());
    partial.clear();
    ++data;
  }
  if (flush_all && !partial.empty()) {
    write_line(sink, rank, partial.data(), partial.size());
    partial.clear();
  }
  std::fflush(sink);
}

// Returns the rank's pid, or -1 with `error` saying what failed.
pid_t spawn(const Options& options, int rank, int port, int listen_fd, int& out_fd, int& err_fd, std::string& error) {
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  auto failed = [&](const char* what) {
    error = std::string(what) + ": " + std::strerror(errno);
    if (errno == EMFILE || errno == ENFILE) error += " (the launcher holds two descriptors per rank; raise ulimit -n)";
    for (const int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return pid_t{-1};
  };
  // Close-on-exec, so that no rank inherits another rank's pipes (dup2 below clears the flag on
  // the rank's own standard output and error).
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) return failed("pipe");
  [[maybe_unused]] const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return failed("fork");
  if (pid == 0) {
    ::setpgid(0, 0);
#ifdef __linux__
    // Killed with the launcher, even by SIGKILL, which leaves it no time to stop the ranks.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(128 + SIGKILL);
#endif
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::close(out_pipe[0]), ::close(out_pipe[1]), ::close(err_pipe[0]), ::close(err_pipe[1]);
    if (rank == 0 && listen_fd >= 0) {
      ::setenv("REMAT_MASTER_LISTEN_FD", std::to_string(listen_fd).c_str(), 1);
    } else {
      if (listen_fd >= 0) ::close(listen_fd);
      ::unsetenv("REMAT_MASTER_LISTEN_FD");
    }
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    std::vector<char*> argv;
    for (const auto& arg : options.command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "remat-launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // as the child does, so that the group exists before either runs on
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  out_fd = out_pipe[0];
  err_fd = err_pipe[0];
  return pid;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return "was killed by signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

volatile sig_atomic_t g_interrupted = 0;  // the signal that asked the launcher to stop
volatile sig_atomic_t g_interrupts = 0;
void on_interrupt(int signal) {
  g_interrupted = signal;
  g_interrupts = g_interrupts + 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  int port = 0;
  int listen_fd = open_listener(options.master_port, port);
  if (options.release_port) {
    ::close(listen_fd);
    listen_fd = -1;
  }

  struct sigaction action {};
  action.sa_handler = on_interrupt;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<Rank> ranks(static_cast<std::size_t>(options.nproc));
  for (int r = 0; r < options.nproc; ++r) {
    Rank& rank = ranks[static_cast<std::size_t>(r)];
    rank.index = r;
    std::string error;
    rank.pid = spawn(options, r, port, listen_fd, rank.out_fd, rank.err_fd, error);
    if (rank.pid < 0) {
      // A job without all its ranks cannot run: the ones started would wait for the rest.
      std::fprintf(stderr, "remat-launch: cannot start rank %d of %d: %s; stopping the ranks started\n", r,
                   options.nproc, error.c_str());
      for (int started = 0; started < r; ++started) ::kill(-ranks[static_cast<std::size_t>(started)].pid, SIGKILL);
      for (int started = 0; started < r; ++started) ::waitpid(ranks[static_cast<std::size_t>(started)].pid, nullptr, 0);
      return 1;
    }
  }
  if (listen_fd >= 0) ::close(listen_fd);  // rank 0 holds it now

  const auto start = Clock::now();
  std::optional<Clock::time_point> stop_at;  // when the ranks still running are stopped
  std::optional<Clock::time_point> kill_at;
  std::optional<Clock::time_point> leftovers_at;  // every rank exited; when what they left is stopped
  std::optional<Clock::time_point> abandon_at;    // when output still open after SIGKILL is let go
  int first_failure = -1;
  bool timed_out = false;
  bool killed = false;
  // Whole process groups, exited ranks' too: a rank's children keep its group (and its output
  // pipes) after it exits. A group with no process left answers ESRCH.
  auto stop_all = [&](int signal) {
    for (const Rank& rank : ranks) ::kill(-rank.pid, signal);
  };
  auto start_stopping = [&](Clock::time_point now) {
    stop_all(SIGTERM);
    kill_at = now + std::chrono::seconds(5);
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> owners;  // (rank, is stdout)
    for (Rank& rank : ranks) {
      if (rank.out_fd >= 0) fds.push_back({rank.out_fd, POLLIN, 0}), owners.emplace_back(&rank, true);
      if (rank.err_fd >= 0) fds.push_back({rank.err_fd, POLLIN, 0}), owners.emplace_back(&rank, false);
    }
    bool any_running = false;
    for (const Rank& rank : ranks) any_running = any_running || rank.running;
    if (fds.empty() && !any_running) break;

    ::poll(fds.data(), fds.size(), 100);
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      auto [rank, is_stdout] = owners[i];
      char buffer[65536];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      std::string& partial = is_stdout ? rank->out_partial : rank->err_partial;
      FILE* sink = is_stdout ? stdout : stderr;
      if (n > 0) {
        forward_lines(rank->index, partial, buffer, static_cast<std::size_t>(n), sink, false);
      } else if (n == 0 || errno != EINTR) {
        forward_lines(rank->index, partial, nullptr, 0, sink, true);
        ::close(fds[i].fd);
        (is_stdout ? rank->out_fd : rank->err_fd) = -1;
      }
    }

    for (Rank& rank : ranks) {
      if (!rank.running) continue;
      int status = 0;
      if (::waitpid(rank.pid, &status, WNOHANG) != rank.pid) continue;
      rank.running = false;
      rank.status = status;
      if (status != 0) {
        std::fprintf(stderr, "remat-launch: rank %d %s\n", rank.index, describe_status(status).c_str());
        if (first_failure < 0) {
          first_failure = rank.index;
          stop_at = Clock::now() +
                    std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.grace_s));
        }
      }
    }

    const auto now = Clock::now();
    any_running = false;
    for (const Rank& rank : ranks) any_running = any_running || rank.running;
    if (g_interrupted && !kill_at) {
      std::fprintf(stderr, "remat-launch: interrupted; stopping every rank (again to kill them at once)\n");
      start_stopping(now);
    }
    if (g_interrupts > 1 && !killed) kill_at = now;
    if (options.timeout_s > 0 && !timed_out && now - start > std::chrono::duration<double>(options.timeout_s)) {
      timed_out = true;
      std::fprintf(stderr, "remat-launch: the job ran past --timeout %g s; stopping every rank\n", options.timeout_s);
      if (!kill_at) start_stopping(now);
    }
    if (stop_at && now >= *stop_at && !kill_at && any_running) {
      std::fprintf(stderr,
                   "remat-launch: rank %d failed and the others did not exit within --grace %g s; stopping them\n",
                   first_failure, options.grace_s);
      start_stopping(now);
    }
    if (!any_running && !leftovers_at) leftovers_at = now + kLeftoverDrain;
    if (leftovers_at && now >= *leftovers_at && !kill_at) {
      std::fprintf(stderr,
                   "remat-launch: every rank exited, but processes they started still hold their output; stopping "
                   "them\n");
      start_stopping(now);
    }
    if (kill_at && now >= *kill_at && !killed) {
      stop_all(SIGKILL);
      killed = true;
      abandon_at = now + std::chrono::seconds(1);
    }
    // Left their process group (setsid) and so out of reach: stop waiting for their output.
    if (abandon_at && now >= *abandon_at && !any_running) {
      for (Rank& rank : ranks) {
        forward_lines(rank.index, rank.out_partial, nullptr, 0, stdout, true);
        forward_lines(rank.index, rank.err_partial, nullptr, 0, stderr, true);
        for (int* fd : {&rank.out_fd, &rank.err_fd}) {
          if (*fd >= 0) ::close(*fd);
          *fd = -1;
        }
      }
    }
  }

  if (g_interrupted) return 128 + g_interrupted;
  if (timed_out) return kTimedOut;
  if (first_failure >= 0) return exit_code_of(ranks[static_cast<std::size_t>(first_failure)].status);
  return 0;
}
