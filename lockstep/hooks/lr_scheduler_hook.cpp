#include "lockstep/hooks/lr_scheduler_hook.h"

#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/strategy/strategy.h"

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

void LRSchedulerHook::after_val_epoch(const std::map<std::string, double>& metrics) {
  for (auto& entry : schedulers_) {
    for (auto& scheduler : entry.second) scheduler->step_with_metrics(metrics);
  }
}

namespace {
std::shared_ptr<Hook> build_lr_scheduler_hook(const Config&, const HookContext& context) {
  return std::make_shared<LRSchedulerHook>(context.strategy->optim_wrapper(), context.strategy->schedulers());
}
}  // namespace

// mmengine calls it ParamSchedulerHook.
LOCKSTEP_REGISTER(hook_registry(), "LRSchedulerHook", build_lr_scheduler_hook);
LOCKSTEP_REGISTER(hook_registry(), "ParamSchedulerHook", build_lr_scheduler_hook);

}  // namespace lockstep
