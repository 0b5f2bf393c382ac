// AccumulationWindow: where a micro-step sits in gradient accumulation.
//
// mmengine's OptimWrapper counting (`accumulative_counts`): the optimizer
// steps once every N micro-steps, the gradients are synchronised only on the
// window's last micro-step, and the last, shorter window of a run with a
// known end divides its losses by its real length. OptimWrapper holds one
// (OptimWrapper::accumulation()).
//
//   lockstep::AccumulationWindow window(/*accumulative_counts=*/4);
//   window.start(/*start_iter=*/0, /*max_iters=*/10);
//   for (int i = 0; i < 10; ++i) {
//     int64_t divisor = window.loss_divisor();  // 4, and 2 for iterations 8 and 9
//     bool sync = window.should_sync();         // iterations 3, 7 and 9
//     window.count();                           // the micro-step's backward ran
//     if (window.should_update()) { /* step the optimizer */ }
//   }
#pragma once

#include <cstdint>

namespace lockstep {

class AccumulationWindow {
 public:
  // accumulative_counts >= 1 (check_optim_wrapper_options checks a user's).
  explicit AccumulationWindow(int64_t accumulative_counts = 1);

  // A run of iterations [start_iter, max_iters) begins (max_iters < 0: no
  // known end). Starting inside a window warns: its first micro-steps'
  // gradients were not saved.
  void start(int64_t start_iter, int64_t max_iters);
  // One micro-step's backward ran.
  void count() { ++inner_count_; }

  // After count(): whether the window closed, so the optimizer steps.
  bool should_update() const;
  // Before the backward: whether this micro-step closes its window, so its
  // gradients are synchronised.
  bool should_sync() const;
  // What this micro-step's loss is divided by: accumulative_counts, the last
  // shorter window's length, or 1.
  int64_t loss_divisor() const;
  // Micro-steps counted (the start iteration included).
  int64_t inner_count() const { return inner_count_; }

 private:
  int64_t accumulative_counts_;
  int64_t inner_count_ = 0;
  int64_t max_counts_ = -1;
  int64_t divisible_counts_ = 0;
  int64_t remainder_counts_ = 0;
};

}  // namespace lockstep
