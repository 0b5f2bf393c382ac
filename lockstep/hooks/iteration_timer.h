// IterationTimer: measures each step's time into the storage ("time") and
// reports the overall speed at the end. Register it first so its time covers
// the other hooks' before_step/after_step work as detectron2's does.
//
//   trainer.register_hooks({std::make_shared<lockstep::IterationTimer>(/*warmup_iters=*/3), ...});
#pragma once

#include <chrono>

#include "lockstep/engine/hook.h"

namespace lockstep {

class IterationTimer : public Hook {
 public:
  explicit IterationTimer(int64_t warmup_iters = 3);
  void before_train() override;
  void after_train() override;
  void before_step() override;
  void after_step() override;

 private:
  using Clock = std::chrono::steady_clock;
  int64_t warmup_iters_;
  Clock::time_point train_start_;
  Clock::time_point step_start_;
  Clock::time_point timed_start_;  // when the first non-warm-up step began
  bool timed_started_ = false;
};

}  // namespace lockstep
