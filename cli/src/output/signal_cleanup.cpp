#include "output/signal_cleanup.hpp"

#include <unistd.h>
#include <atomic>
#include <climits>
#include <csignal>
#include <cstring>

namespace remat::report {

namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Written only while `g_armed` is 0, read by the handler only while it is 1.
char g_path[PATH_MAX];
volatile std::sig_atomic_t g_armed = 0;
bool g_installed = false;

extern "C" void remove_and_resume(int signal) {
  if (g_armed != 0) ::unlink(g_path);
  // SA_RESETHAND restored the default action: raised again, the signal ends the process as it
  // would have, once this handler returns.
  std::raise(signal);
}

void install_handlers() {
  g_installed = true;
  for (const int signal : kSignals) {
    struct sigaction previous {};
    if (::sigaction(signal, nullptr, &previous) != 0 || previous.sa_handler != SIG_DFL) continue;
    struct sigaction action {};
    action.sa_handler = remove_and_resume;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    ::sigaction(signal, &action, nullptr);
  }
}

}  // namespace

bool remove_on_signal(std::string_view path) {
  if (g_armed != 0 || path.size() >= sizeof(g_path)) return false;
  std::memcpy(g_path, path.data(), path.size());
  g_path[path.size()] = '\0';
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the path is whole before the handler may read it
  g_armed = 1;
  if (!g_installed) install_handlers();
  return true;
}

void forget_temporary_file() { g_armed = 0; }

}  // namespace remat::report
