#include "lockstep/hooks/preemption_hook.h"

#include "lockstep/core/stop_signals.h"
#include "lockstep/engine/trainer.h"

namespace lockstep {

PreemptionHook::PreemptionHook() : Hook("PreemptionHook") {}

void PreemptionHook::check() {
  const int signal_number = StopSignals::received();
  if (signal_number != 0) trainer().request_preemption_stop(signal_name(signal_number) + " received");
}

}  // namespace lockstep
