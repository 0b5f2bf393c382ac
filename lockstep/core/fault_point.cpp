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
  if (++reached == spec.nth) die_by_fault_injection(str_cat("reached fault point '", point, "' (time ", spec.nth, ")"));
}

}  // namespace lockstep
