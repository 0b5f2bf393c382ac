#include "lockstep/hooks/lr_scheduler_hook.h"

#include "lockstep/engine/trainer.h"

namespace lockstep {

LRSchedulerHook::LRSchedulerHook(std::shared_ptr<OptimWrapperBase> optim_wrapper, SchedulerMap schedulers)
    : Hook("LRSchedulerHook"), optim_wrapper_(std::move(optim_wrapper)), schedulers_(std::move(schedulers)) {}

void LRSchedulerHook::after_step() {
  // The lr used by this iteration's step is what gets logged for it.
  for (const auto& [name, lr] : optim_wrapper_->learning_rates()) {
    trainer().storage().put_scalar(name.empty() ? "lr" : "lr/" + name, lr, /*smoothing_hint=*/false);
  }
  for (auto& entry : schedulers_) {
    for (auto& scheduler : entry.second) scheduler->step();
  }
}

}  // namespace lockstep
