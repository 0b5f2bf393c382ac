// Fault injection: test machinery that makes a process die where a real
// fault would strike, so reliability tests can prove recovery end to end.
//
// Two switches, both off unless a test turns them on:
//
//   - The FaultInjection hook SIGKILLs its own process at a chosen training
//     iteration, on one rank, in one attempt of the job (the launcher's
//     TORCHELASTIC_RESTART_COUNT, or an elastic job's rendezvous round: see
//     job_attempt() in lockstep/comm/env.h), so the restarted job runs clean:
//
//       custom_hooks:
//         - {type: FaultInjection, kill_at_iter: 17, rank: 1, attempt: 0}
//
//     With step_delay_ms every step of every rank sleeps that long first, so
//     a test can act on a run while it is in flight (take a network link
//     down, say); kill_at_iter may then be left out:
//
//         - {type: FaultInjection, step_delay_ms: 100}
//
//     With signal_at_iter the chosen rank sends a signal instead, at the start
//     of that iteration: to its launcher (signal_to: launcher, the parent
//     process: `lockstep run` or torchrun) or to itself (signal_to: self), as
//     a scheduler's preemption would:
//
//         - {type: FaultInjection, signal_at_iter: 12, signal: SIGTERM, signal_to: launcher, rank: 0}
//
//   - Named fault points in library code: see core/fault_point.h.
//
// SIGKILL, not an exception: nothing unwinds, no destructor tidies up -- what
// a power cut, the OOM killer or `kill -9` leave behind is what is tested.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/engine/hook.h"

namespace lockstep {

class FaultInjectionHook : public Hook {
 public:
  // attempt -1: every attempt (the job can then never finish);
  // kill_at_iter -1: never.
  FaultInjectionHook(int64_t kill_at_iter, int rank, int attempt, int64_t step_delay_ms = 0);
  // At `iteration`, send `signal_number` to the launcher (the parent) or to this process.
  FaultInjectionHook& signal_at(int64_t iteration, int signal_number, bool to_launcher);
  void before_step() override;

 private:
  bool armed_here() const;
  int64_t kill_at_iter_;
  int64_t signal_at_iter_ = -1;
  int signal_ = 0;
  bool signal_to_launcher_ = false;
  int64_t step_delay_ms_;
  int rank_;
  int attempt_;
};

}  // namespace lockstep
