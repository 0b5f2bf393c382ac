#include "lockstep/core/stop_signals.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

std::atomic<int> g_received{0};
std::mutex g_install_mutex;
int g_installations = 0;  // StopSignals alive
std::vector<int> g_installed_signals;
std::thread g_grace_watch;
int g_wake_pipe[2] = {-1, -1};
std::map<int, struct sigaction> g_saved;

// Note [A second signal ends the process]
// The first signal is a request: finish the iteration, save, exit. Whoever
// sends another (a user pressing Ctrl-C twice, SLURM's SIGTERM at the time
// limit after its --signal warning, `kill` again) means "now". The handler
// restores the signal's default action and raises it again; the signal is
// blocked while its own handler runs, so it is delivered, and ends the
// process, as soon as the handler returns. Nothing is torn: checkpoint files
// appear by rename only (core/atomic_file.h).
void on_stop_signal(int signal_number) {
  const int saved_errno = errno;
  int expected = 0;
  if (!g_received.compare_exchange_strong(expected, signal_number)) {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(signal_number, &default_action, nullptr);
    raise(signal_number);
    errno = saved_errno;
    return;
  }
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  ssize_t ignored = write(g_wake_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

void write_stderr(const std::string& text) {
  ssize_t ignored = write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

// Waits for the first signal, then for the grace period; the pipe's write end
// closing (the StopSignals going away) ends the wait either way.
void watch_grace(int read_end, double grace_seconds) {
  pollfd fd{read_end, POLLIN, 0};
  while (true) {
    const int ready = poll(&fd, 1, -1);
    if (ready < 0 && errno == EINTR) continue;
    unsigned char byte = 0;
    if (ready <= 0 || read(read_end, &byte, 1) != 1) return;  // closed: the run ended without a signal
    break;
  }
  if (grace_seconds <= 0) return;
  const auto deadline_ms = static_cast<int>(std::min(grace_seconds * 1000.0, 2147483647.0));
  int left_ms = deadline_ms;
  while (left_ms > 0) {
    const auto start = std::chrono::steady_clock::now();
    const int ready = poll(&fd, 1, left_ms);
    if (ready > 0) return;  // closed: the run finished within its grace
    if (ready < 0 && errno != EINTR) return;
    left_ms -= static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
    if (ready == 0) break;
  }
  const int signal_number = g_received.load();
  write_stderr(str_cat("lockstep: the grace period of ", grace_seconds, " s after ", signal_name(signal_number),
                       " ran out; exiting now\n"));
  _exit(128 + signal_number);
}

}  // namespace

StopSignals::StopSignals(std::vector<int> signals, double grace_seconds) : signals_(std::move(signals)) {
  LOCKSTEP_CHECK(std::isfinite(grace_seconds) && grace_seconds >= 0, "StopSignals: grace_seconds must be >= 0, got ",
                 grace_seconds);
  std::lock_guard<std::mutex> lock(g_install_mutex);
  // Two runs alive in one process (two Runners) share the first's handlers:
  // a signal is the process's, and stops both.
  if (g_installations++ > 0) return;
  if (pipe2(g_wake_pipe, O_CLOEXEC) != 0) {
    --g_installations;
    LOCKSTEP_FAIL("StopSignals: pipe: ", std::strerror(errno));
  }
  g_received = 0;
  g_grace_watch = std::thread(watch_grace, g_wake_pipe[0], grace_seconds);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  g_installed_signals = signals_;
  for (int signal_number : signals_) sigaction(signal_number, &action, &g_saved[signal_number]);
}

StopSignals::~StopSignals() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (--g_installations > 0) return;
  for (int signal_number : g_installed_signals) sigaction(signal_number, &g_saved[signal_number], nullptr);
  g_saved.clear();
  close(g_wake_pipe[1]);
  if (g_grace_watch.joinable()) g_grace_watch.join();
  close(g_wake_pipe[0]);
  g_wake_pipe[0] = g_wake_pipe[1] = -1;
}

int StopSignals::received() { return g_received.load(); }

int parse_signal(const std::string& text, const std::string& where) {
  // SIGCONT and SIGURG are left out: SLURM sends SIGCONT ahead of every
  // signal it delivers, and a stop on it would stop every job it touches.
  static const std::map<std::string, int> kNames{{"TERM", SIGTERM}, {"INT", SIGINT},   {"HUP", SIGHUP},
                                                 {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"QUIT", SIGQUIT},
                                                 {"XCPU", SIGXCPU}};
  std::string name = text;
  for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  auto found = kNames.find(name);
  if (found != kNames.end()) return found->second;
  if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos && name.size() < 4) {
    const int number = std::stoi(name);
    for (const auto& [known, value] : kNames) {
      if (value == number) return number;
    }
  }
  LOCKSTEP_FAIL(where, ": '", text, "' is not a signal a job can catch (expected SIGTERM, SIGUSR1, SIGUSR2, SIGINT, ",
                "SIGHUP, SIGQUIT or SIGXCPU, by name or number)");
}

std::string signal_name(int signal_number) {
  const char* abbreviation = sigabbrev_np(signal_number);
  return abbreviation != nullptr ? std::string("SIG") + abbreviation : str_cat("signal ", signal_number);
}

}  // namespace lockstep
