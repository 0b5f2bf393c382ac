#include "lockstep/hooks/fault_injection.h"

#include <chrono>
#include <thread>

#include "lockstep/core/error.h"
#include "lockstep/core/fault_point.h"
#include "lockstep/dist/env.h"
#include "lockstep/dist/init.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

FaultInjectionHook::FaultInjectionHook(int64_t kill_at_iter, int rank, int attempt, int64_t step_delay_ms)
    : Hook("FaultInjection"),
      kill_at_iter_(kill_at_iter),
      step_delay_ms_(step_delay_ms),
      rank_(rank),
      attempt_(attempt) {}

void FaultInjectionHook::before_step() {
  if (step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms_));
  if (trainer().iter() != kill_at_iter_) return;
  const int rank = is_initialized() ? world()->rank() : 0;
  const int attempt = job_attempt();
  if (rank != rank_ || (attempt_ >= 0 && attempt != attempt_)) return;
  die_by_fault_injection(str_cat("rank ", rank, " killed at iteration ", kill_at_iter_, " (attempt ", attempt, ")"));
}

LOCKSTEP_REGISTER(hook_registry(), "FaultInjection", [](const Config& config, const HookContext&) {
  const int64_t delay = config.get<int64_t>("step_delay_ms", 0);
  LOCKSTEP_CHECK(delay >= 0, config.where("step_delay_ms"), ": step_delay_ms must be >= 0, got ", delay);
  LOCKSTEP_CHECK(config.has("kill_at_iter") || delay > 0, config.where(), ": FaultInjection needs kill_at_iter, "
                 "step_delay_ms or both");
  const int64_t iteration = config.has("kill_at_iter") ? config.get<int64_t>("kill_at_iter") : -1;
  LOCKSTEP_CHECK(!config.has("kill_at_iter") || iteration >= 0, config.where("kill_at_iter"),
                 ": kill_at_iter must be >= 0, got ", iteration);
  return std::make_shared<FaultInjectionHook>(iteration, static_cast<int>(config.get<int64_t>("rank", 0)),
                                              static_cast<int>(config.get<int64_t>("attempt", 0)), delay);
});

}  // namespace lockstep
