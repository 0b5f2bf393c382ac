#include "lockstep/optim/accumulation_window.h"

#include "lockstep/core/internal/internal_error.h"
#include "lockstep/core/logging.h"

namespace lockstep {

AccumulationWindow::AccumulationWindow(int64_t accumulative_counts) : accumulative_counts_(accumulative_counts) {
  // The user's value is checked once, with its key, by check_optim_wrapper_options.
  LOCKSTEP_ASSERT(accumulative_counts_ >= 1, "an accumulation window of ", accumulative_counts_, " micro-steps");
}

void AccumulationWindow::start(int64_t start_iter, int64_t max_iters) {
  const int64_t accumulation = accumulative_counts_;
  inner_count_ = start_iter;
  max_counts_ = max_iters;
  if (start_iter % accumulation != 0) {
    // Resuming inside an accumulation window: gradients of the window's first
    // micro-steps were not saved, so the first update sees fewer micro-batches
    // (mmengine warns the same way).
    const int64_t window_start = start_iter - start_iter % accumulation;
    logger().warn("Starting at iteration {}, inside an accumulation window of {} micro-steps (iterations {}-{}): "
                  "the gradients of its first {} micro-step(s) were not saved, so this window's update sums only {} "
                  "of them and the run is no longer the uninterrupted one. Save checkpoints at multiples of "
                  "accumulative_counts ({}) to resume exactly.",
                  start_iter, accumulation, window_start, window_start + accumulation - 1, start_iter - window_start,
                  window_start + accumulation - start_iter, accumulation);
  }
  if (max_iters >= 0) {
    remainder_counts_ = max_iters % accumulation;
    divisible_counts_ = max_iters - remainder_counts_;
  }
}

int64_t AccumulationWindow::loss_divisor() const {
  if (accumulative_counts_ == 1) return 1;
  if (max_counts_ < 0 || inner_count_ < divisible_counts_) return accumulative_counts_;
  return remainder_counts_;  // the last, shorter window
}

bool AccumulationWindow::should_update() const {
  return inner_count_ % accumulative_counts_ == 0 || inner_count_ == max_counts_;
}

bool AccumulationWindow::should_sync() const {
  return (inner_count_ + 1) % accumulative_counts_ == 0 || inner_count_ + 1 == max_counts_;
}

}  // namespace lockstep
