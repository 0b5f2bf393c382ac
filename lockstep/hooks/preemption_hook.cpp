#include "lockstep/hooks/preemption_hook.h"

#include "lockstep/core/error.h"
#include "lockstep/core/stop_signals.h"
#include "lockstep/engine/trainer.h"

namespace lockstep {

PreemptionHook::PreemptionHook(int64_t check_interval) : Hook("PreemptionHook"), check_interval_(check_interval) {
  LOCKSTEP_CHECK(check_interval_ >= 1, "PreemptionHook: check_interval must be at least 1, got ", check_interval_);
}

void PreemptionHook::check() {
  const int signal_number = StopSignals::received();
  if (signal_number != 0) trainer().stop().request_preemption(signal_name(signal_number) + " received");
}

}  // namespace lockstep
