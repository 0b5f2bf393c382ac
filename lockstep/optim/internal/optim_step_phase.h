// The edges of an OptimWrapper's step phases (OptimWrapper::StepPhase):
// running -> reduced -> failed, running -> failed, reduced -> reduced, and
// back to running from anywhere when a step begins. The wrapper checks what
// a user can get wrong first (a backward after its step's failure was
// reported); a move without an edge is a lockstep bug (InternalError).
//
//   OptimWrapper::StepPhase phase = OptimWrapper::StepPhase::kRunning;
//   move_optim_step_phase(phase, OptimWrapper::StepPhase::kFailed);    // fine
//   move_optim_step_phase(phase, OptimWrapper::StepPhase::kReduced);   // InternalError: "... has no move
//                                                                      //   from failed to reduced"
#pragma once

#include "lockstep/optim/optim_wrapper.h"

namespace lockstep {

void move_optim_step_phase(OptimWrapper::StepPhase& phase, OptimWrapper::StepPhase to);

}  // namespace lockstep
