#include "lockstep/hooks/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "lockstep/core/error.h"
#include "lockstep/dist/init.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

namespace {

int restart_attempt() {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return count != nullptr && *count != '\0' ? std::atoi(count) : 0;
}

[[noreturn]] void die(const std::string& why) {
  // Straight to the file descriptor: the message must land before the kill.
  std::string line = "lockstep fault injection: " + why + "; SIGKILL\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached
}

struct FaultSpec {
  std::string point;  // empty: no fault point armed
  long long nth = 1;
};

const FaultSpec& armed_fault() {
  static const FaultSpec spec = [] {
    FaultSpec parsed;
    const char* value = std::getenv("LOCKSTEP_FAULT_KILL_AT");
    if (value == nullptr || *value == '\0') return parsed;
    parsed.point = value;
    const auto at = parsed.point.rfind('@');
    if (at != std::string::npos) {
      parsed.nth = std::atoll(parsed.point.c_str() + at + 1);
      parsed.point.resize(at);
      LOCKSTEP_CHECK(parsed.nth >= 1, "LOCKSTEP_FAULT_KILL_AT=", value, ": the count after '@' must be at least 1");
    }
    return parsed;
  }();
  return spec;
}

}  // namespace

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
  if (rank != rank_ || (attempt_ >= 0 && restart_attempt() != attempt_)) return;
  die(str_cat("rank ", rank, " killed at iteration ", kill_at_iter_, " (attempt ", restart_attempt(), ")"));
}

void fault_point(const std::string& point) {
  const FaultSpec& spec = armed_fault();
  if (spec.point.empty() || spec.point != point) return;
  static std::atomic<long long> reached{0};
  if (++reached == spec.nth) die(str_cat("reached fault point '", point, "' (time ", spec.nth, ")"));
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
