#include "lockstep/launch/internal/signal_scope.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

int g_signal_pipe[2] = {-1, -1};

void on_signal(int signal_number) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signal_number);
  ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

}  // namespace

SignalScope::SignalScope() {
  LOCKSTEP_CHECK(pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "lockstep run: pipe: ", std::strerror(errno));
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : kForwarded) sigaction(s, &action, &saved_[index(s)]);
  sigaction(SIGCHLD, &action, &saved_chld_);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &saved_pipe_);
}

SignalScope::~SignalScope() {
  for (int s : kForwarded) sigaction(s, &saved_[index(s)], nullptr);
  sigaction(SIGCHLD, &saved_chld_, nullptr);
  sigaction(SIGPIPE, &saved_pipe_, nullptr);
  close(g_signal_pipe[0]);
  close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
}

int SignalScope::read_fd() { return g_signal_pipe[0]; }

size_t SignalScope::index(int s) {
  size_t i = 0;
  while (kForwarded[i] != s) ++i;
  return i;
}

}  // namespace lockstep
