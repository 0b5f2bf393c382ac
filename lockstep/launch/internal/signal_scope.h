// The launcher's signal handling: for the lifetime of a SignalScope, SIGINT,
// SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 and SIGCHLD are written, one byte each,
// into a pipe the supervisor polls beside its workers' output (the handler
// does nothing else, so it is async-signal-safe), and SIGPIPE is ignored; the
// previous handlers come back afterwards.
//
//   SignalScope signals;
//   pollfd fd{SignalScope::read_fd(), POLLIN, 0};
//   unsigned char signal_number;
//   while (read(SignalScope::read_fd(), &signal_number, 1) == 1) { /* forward it */ }
#pragma once

#include <signal.h>

#include <iterator>

#include <c10/macros/Macros.h>

namespace lockstep {

class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  C10_DISABLE_COPY_AND_ASSIGN(SignalScope);

  // The pipe's read end (non-blocking); -1 outside a SignalScope.
  static int read_fd();

  // SIGUSR1/2 are the early warnings a scheduler may send (SLURM's
  // --signal=USR1@90): passed on, and the workers decide what they mean.
  static constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

 private:
  static size_t index(int s);
  struct sigaction saved_[std::size(kForwarded)] {};
  struct sigaction saved_chld_ {};
  struct sigaction saved_pipe_ {};
};

}  // namespace lockstep
