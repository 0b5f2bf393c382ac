// The edges of an OptimWrapper's step phases (StepProgress::Phase):
// running -> reduced -> failed, running -> failed, reduced -> reduced, and
// back to running from anywhere when a step begins. The wrapper checks what
// a user can get wrong first (a backward after its step's failure was
// reported); a move without an edge is a lockstep bug (InternalError).
//
//   StepProgress::Phase phase = StepProgress::Phase::kRunning;
//   move_optim_step_phase(phase, StepProgress::Phase::kFailed);    // fine
//   move_optim_step_phase(phase, StepProgress::Phase::kReduced);   // InternalError: "... has no move
//                                                                      //   from failed to reduced"
#pragma once

#include "lockstep/optim/step_progress.h"

namespace lockstep {

void move_optim_step_phase(StepProgress::Phase& phase, StepProgress::Phase to);

}  // namespace lockstep
