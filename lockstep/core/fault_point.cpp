#include "lockstep/core/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

struct FaultSpec {
  std::string point;  // empty: no fault point armed
  long long nth = 1;
  enum Action { kKill, kThrow, kStall } action = kKill;
};

FaultSpec parse_fault(const char* variable, FaultSpec::Action action) {
  FaultSpec parsed;
  parsed.action = action;
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return parsed;
  // LOCKSTEP_FAULT_RANK=r arms the point on that rank (the launcher's RANK) only.
  const char* only_rank = std::getenv("LOCKSTEP_FAULT_RANK");
  const char* rank = std::getenv("RANK");
  if (only_rank != nullptr && *only_rank != '\0' && std::string(only_rank) != (rank != nullptr ? rank : "0")) {
    return parsed;
  }
  parsed.point = value;
  const auto at = parsed.point.rfind('@');
  if (at != std::string::npos) {
    parsed.nth = std::atoll(parsed.point.c_str() + at + 1);
    parsed.point.resize(at);
    LOCKSTEP_CHECK(parsed.nth >= 1, variable, "=", value, ": the count after '@' must be at least 1");
  }
  return parsed;
}

const FaultSpec& armed_fault() {
  static const FaultSpec spec = [] {
    FaultSpec kill = parse_fault("LOCKSTEP_FAULT_KILL_AT", FaultSpec::kKill);
    if (!kill.point.empty()) return kill;
    FaultSpec thrown = parse_fault("LOCKSTEP_FAULT_THROW_AT", FaultSpec::kThrow);
    return thrown.point.empty() ? parse_fault("LOCKSTEP_FAULT_STALL_AT", FaultSpec::kStall) : thrown;
  }();
  return spec;
}

}  // namespace

void die_by_fault_injection(const std::string& why) {
  // Straight to the file descriptor: the message must land before the kill.
  std::string line = "lockstep fault injection: " + why + "; SIGKILL\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached
}

void fault_point(const std::string& point) {
  const FaultSpec& spec = armed_fault();
  if (spec.point.empty() || spec.point != point) return;
  static std::atomic<long long> reached{0};
  if (++reached != spec.nth) return;
  const std::string why = str_cat("reached fault point '", point, "' (time ", spec.nth, ")");
  if (spec.action == FaultSpec::kThrow) LOCKSTEP_FAIL("lockstep fault injection: ", why);
  if (spec.action == FaultSpec::kStall) {
    const std::string line = "lockstep fault injection: " + why + "; stalling until killed\n";
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
    while (true) ::pause();
  }
  die_by_fault_injection(why);
}

}  // namespace lockstep
