#include "lockstep/hooks/iteration_timer.h"

#include "lockstep/core/logging.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/events/console_writer.h"

namespace lockstep {

IterationTimer::IterationTimer(int64_t warmup_iters) : Hook("IterationTimer"), warmup_iters_(warmup_iters) {}

void IterationTimer::before_train() {
  train_start_ = Clock::now();
  timed_started_ = false;
}

void IterationTimer::after_train() {
  const double total = std::chrono::duration<double>(Clock::now() - train_start_).count();
  const int64_t iters_done = trainer().iter() - trainer().start_iter() - warmup_iters_;
  if (timed_started_ && iters_done > 0) {
    const double timed = std::chrono::duration<double>(Clock::now() - timed_start_).count();
    logger().info("Overall training speed: {} iterations in {} ({:.4f} s / it)", iters_done, format_duration(timed),
                  timed / static_cast<double>(iters_done));
  }
  logger().info("Total training time: {}", format_duration(total));
}

void IterationTimer::before_step() {
  step_start_ = Clock::now();
  if (!timed_started_ && trainer().iter() >= trainer().start_iter() + warmup_iters_) {
    timed_start_ = step_start_;
    timed_started_ = true;
  }
}

void IterationTimer::after_step() {
  const double seconds = std::chrono::duration<double>(Clock::now() - step_start_).count();
  // Warm-up steps (allocator growth, first-iteration bucket rebuilds) would skew the ETA.
  if (trainer().iter() >= trainer().start_iter() + warmup_iters_) trainer().storage().put_scalar("time", seconds);
}

namespace {
std::shared_ptr<Hook> build_iteration_timer(const Config& config, const HookContext&) {
  const int64_t warmup = config.get<int64_t>("warmup_iters", 3);
  LOCKSTEP_CHECK(warmup >= 0, config.where("warmup_iters"), ": warmup_iters must be >= 0, got ", warmup);
  return std::make_shared<IterationTimer>(warmup);
}
}  // namespace

// mmengine calls it IterTimerHook.
LOCKSTEP_REGISTER(hook_registry(), "IterationTimer", build_iteration_timer);
LOCKSTEP_REGISTER(hook_registry(), "IterTimerHook", build_iteration_timer);

}  // namespace lockstep
