// StepProgress: where an optim wrapper's step in progress is, so that a
// failure is reported once, saying whether the gradients were reduced.
//
// Running (no synchronised backward has completed), reduced (one has: every
// rank's gradients are summed), failed (its failure was reported, once). A
// trainer's step begins at begin(); without one, each backward pass begins a
// step of its own. Each move is asserted against the machine's edges
// (step_progress.cpp), as PyTorch's FSDP asserts its TrainingState.
//
//   lockstep::StepProgress progress;
//   progress.begin(&context);           // a trainer's step
//   progress.mark_reduced();            // a synchronised backward completed
//   bool reduced = false;
//   if (progress.fail(reduced)) sync->step_failed(error, reduced, ...);  // once
//   progress.end();
#pragma once

#include <cstdint>

namespace lockstep {

struct StepContext;

class StepProgress {
 public:
  enum class Phase { kRunning, kReduced, kFailed };

  // A trainer's step begins; `context` must outlive end(). One at a time: a
  // second begin() before end() is an error (two trainers driving one wrapper).
  void begin(const StepContext* context);
  void end() { context_ = nullptr; }
  // A backward pass begins: without a trainer's step, a step of its own.
  void begin_backward();
  // A synchronised backward completed. An error when the step's failure was
  // already reported: every rank dropped the step.
  void mark_reduced();
  // The step failed: true the first time, with `reduced` saying whether its
  // gradients had been reduced; false when it was already reported.
  bool fail(bool& reduced);

  Phase phase() const { return phase_; }
  // The trainer's step context, or null.
  const StepContext* context() const { return context_; }
  // The iteration the step reduces: the trainer's, or `counted` (the
  // wrapper's own count) without one.
  int64_t iteration(int64_t counted) const;

 private:
  const StepContext* context_ = nullptr;
  Phase phase_ = Phase::kRunning;
};

}  // namespace lockstep
