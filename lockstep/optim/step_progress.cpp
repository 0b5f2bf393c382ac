#include "lockstep/optim/step_progress.h"

#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/optim/internal/optim_step_phase.h"
#include "lockstep/optim/optim_wrapper.h"

namespace lockstep {

// The edges of the step's phases (StepProgress::Phase).
void move_optim_step_phase(StepProgress::Phase& phase, StepProgress::Phase to) {
  using Phase = StepProgress::Phase;
  constexpr unsigned kMayComeFrom[] = {
      kFromAny,                                               // running: a step begins
      phase_bit(Phase::kRunning) | phase_bit(Phase::kReduced),  // reduced (again: two updates in one step)
      phase_bit(Phase::kRunning) | phase_bit(Phase::kReduced),  // failed, reported once
  };
  constexpr const char* kNames[] = {"running", "reduced", "failed"};
  move_phase("the optim wrapper's step", phase, to, kMayComeFrom, kNames);
}

void StepProgress::begin(const StepContext* context) {
  LOCKSTEP_CHECK(context_ == nullptr, "an optim wrapper serves one step at a time: a step began while another was "
                 "still running (two trainers driving one optim wrapper?)");
  context_ = context;
  move_optim_step_phase(phase_, Phase::kRunning);
}

void StepProgress::begin_backward() {
  if (context_ == nullptr) move_optim_step_phase(phase_, Phase::kRunning);  // no trainer: a step of its own
}

void StepProgress::mark_reduced() {
  LOCKSTEP_CHECK(phase_ != Phase::kFailed, "a backward pass completed in a step whose failure was already "
                 "reported (GradientSync::step_failed): the step is dropped on every rank, so rethrow its error "
                 "instead of going on with it");
  move_optim_step_phase(phase_, Phase::kReduced);
}

bool StepProgress::fail(bool& reduced) {
  if (phase_ == Phase::kFailed) return false;
  reduced = phase_ == Phase::kReduced;
  move_optim_step_phase(phase_, Phase::kFailed);
  return true;
}

int64_t StepProgress::iteration(int64_t counted) const {
  return context_ != nullptr && context_->iteration >= 0 ? context_->iteration : counted;
}

}  // namespace lockstep
