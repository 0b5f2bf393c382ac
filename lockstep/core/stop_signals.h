// StopSignals: the signals a scheduler sends before it stops a job, turned
// into a flag the training loop reads between iterations.
//
// SLURM sends SIGTERM at a time limit or a preemption (and, with
// `#SBATCH --signal=USR1@90`, SIGUSR1 ninety seconds before); Kubernetes
// sends SIGTERM before it kills a pod; `lockstep run` and torchrun forward the
// SIGTERM they receive to every worker. While a StopSignals is alive:
//
//   - the first of its signals only sets the flag (received() returns it):
//     the loop finishes its iteration, the ranks agree to stop, save and exit
//     (hooks/preemption_hook.h);
//   - a second one, of any of its signals, ends the process at once with that
//     signal's default action: a checkpoint being written is left unfinished
//     but never torn, since checkpoint files appear by rename only;
//   - `grace_seconds` after the first signal (0: never) the process ends with
//     128 + the signal, whatever it is doing: a save stuck on a peer that
//     died must not outlive the scheduler's patience.
//
//   lockstep::StopSignals signals({SIGTERM, SIGUSR1}, /*grace_seconds=*/60);
//   while (training) {
//     step();
//     if (signals.received() != 0) { save(); return lockstep::kExitRequeue; }
//   }
//
// StopSignals alive at the same time (two Runners in one process) share the
// first one's signals and grace; the last one to go restores the previous
// handlers.
#pragma once

#include <string>
#include <vector>

#include <c10/macros/Macros.h>

namespace lockstep {

// The exit status of a process that stopped on a signal after saving its
// state, and asks to be started again (EX_TEMPFAIL from sysexits.h: "a
// temporary failure; the user is invited to retry"). `lockstep train` exits
// with it after a preemption; `lockstep run` passes it on.
constexpr int kExitRequeue = 75;

class StopSignals {
 public:
  StopSignals(std::vector<int> signals, double grace_seconds);
  ~StopSignals();
  C10_DISABLE_COPY_AND_ASSIGN(StopSignals);

  // The first signal received, 0 while none has come.
  static int received();

 private:
  std::vector<int> signals_;
};

// "SIGTERM", "TERM", "USR1", "SIGUSR1" or the number of one of the signals
// a job may stop on (TERM, INT, HUP, USR1, USR2, QUIT, XCPU) -> its number;
// an error naming `where` for anything else.
int parse_signal(const std::string& text, const std::string& where);
// "SIGTERM" for 15.
std::string signal_name(int signal_number);

}  // namespace lockstep
