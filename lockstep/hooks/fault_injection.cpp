#include "lockstep/hooks/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "lockstep/core/error.h"
#include "lockstep/core/fault_point.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/stop_signals.h"
#include "lockstep/comm/env.h"
#include "lockstep/comm/init.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

FaultInjectionHook::FaultInjectionHook(int64_t kill_at_iter, int rank, int attempt, int64_t step_delay_ms)
    : Hook("FaultInjection"),
      kill_at_iter_(kill_at_iter),
      step_delay_ms_(step_delay_ms),
      rank_(rank),
      attempt_(attempt) {}

FaultInjectionHook& FaultInjectionHook::signal_at(int64_t iteration, int signal_number, bool to_launcher) {
  signal_at_iter_ = iteration;
  signal_ = signal_number;
  signal_to_launcher_ = to_launcher;
  return *this;
}

bool FaultInjectionHook::armed_here() const {
  const int rank = is_initialized() ? world()->rank() : 0;
  return rank == rank_ && (attempt_ < 0 || job_attempt() == attempt_);
}

void FaultInjectionHook::before_step() {
  if (step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms_));
  const int64_t iteration = trainer().iter();
  if (iteration == signal_at_iter_ && armed_here()) {
    const pid_t target = signal_to_launcher_ ? getppid() : getpid();
    logger().info("lockstep fault injection: sending {} to {} (pid {}) at iteration {}", signal_name(signal_),
                  signal_to_launcher_ ? "the launcher" : "this process", target, iteration);
    ::kill(target, signal_);
  }
  if (iteration != kill_at_iter_ || !armed_here()) return;
  die_by_fault_injection(str_cat("rank ", rank_, " killed at iteration ", kill_at_iter_, " (attempt ", job_attempt(),
                                 ")"));
}

LOCKSTEP_REGISTER(hook_registry(), "FaultInjection", [](const Config& config, const HookContext&) {
  const int64_t delay = config.get<int64_t>("step_delay_ms", 0);
  LOCKSTEP_CHECK(delay >= 0, config.where("step_delay_ms"), ": step_delay_ms must be >= 0, got ", delay);
  LOCKSTEP_CHECK(config.has("kill_at_iter") || config.has("signal_at_iter") || delay > 0, config.where(),
                 ": FaultInjection needs kill_at_iter, signal_at_iter, step_delay_ms or several");
  const int64_t iteration = config.has("kill_at_iter") ? config.get<int64_t>("kill_at_iter") : -1;
  LOCKSTEP_CHECK(!config.has("kill_at_iter") || iteration >= 0, config.where("kill_at_iter"),
                 ": kill_at_iter must be >= 0, got ", iteration);
  auto hook = std::make_shared<FaultInjectionHook>(iteration, static_cast<int>(config.get<int64_t>("rank", 0)),
                                                   static_cast<int>(config.get<int64_t>("attempt", 0)), delay);
  if (config.has("signal_at_iter")) {
    const int64_t at = config.get<int64_t>("signal_at_iter");
    LOCKSTEP_CHECK(at >= 0, config.where("signal_at_iter"), ": signal_at_iter must be >= 0, got ", at);
    const std::string to = config.get<std::string>("signal_to", "launcher");
    LOCKSTEP_CHECK(to == "launcher" || to == "self", config.where("signal_to"),
                   ": signal_to is launcher or self, got '", to, "'");
    hook->signal_at(at, parse_signal(config.get<std::string>("signal", "SIGTERM"), config.where("signal")),
                    to == "launcher");
  }
  return hook;
});

}  // namespace lockstep
