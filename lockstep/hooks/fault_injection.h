// Fault injection: test machinery that makes a process die where a real
// fault would strike, so reliability tests can prove recovery end to end.
//
// Two switches, both off unless a test turns them on:
//
//   - The FaultInjection hook SIGKILLs its own process at a chosen training
//     iteration, on one rank, in one restart attempt of the job (the
//     launcher's TORCHELASTIC_RESTART_COUNT), so the restarted job runs clean:
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
//   - Named fault points in library code: with LOCKSTEP_FAULT_KILL_AT=<point>
//     (or <point>@<n> for the n-th time it is reached, default 1) a process
//     SIGKILLs itself when it reaches that point. AtomicFileWriter reaches
//     "write:<file name>" after each chunk it writes, so
//
//       LOCKSTEP_FAULT_KILL_AT=write:model_0000019.ckpt@2 lockstep train cfg.yaml
//
//     dies in the middle of saving that checkpoint, leaving a partial file.
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
  void before_step() override;

 private:
  int64_t kill_at_iter_;
  int64_t step_delay_ms_;
  int rank_;
  int attempt_;
};

// Kills this process with SIGKILL if LOCKSTEP_FAULT_KILL_AT names `point`
// (counting how often it was reached). Costs one string compare when set,
// nothing else when unset.
void fault_point(const std::string& point);

}  // namespace lockstep
