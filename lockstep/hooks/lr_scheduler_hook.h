// LRSchedulerHook: steps every parameter scheduler once per iteration and
// records the learning rate of each optim wrapper's main param group ("lr",
// or "lr/<name>" with several optimizers). After each validation pass it
// hands the metrics to the schedulers that act on them (ReduceOnPlateauLR).
//
//   auto lr_hook = std::make_shared<lockstep::LRSchedulerHook>(strategy->optim_wrapper(),
//                                                              strategy->schedulers());
#pragma once

#include <memory>

#include "lockstep/engine/hook.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {

class LRSchedulerHook : public Hook {
 public:
  LRSchedulerHook(std::shared_ptr<OptimWrapperBase> optim_wrapper, SchedulerMap schedulers);
  void after_step() override;
  void after_val_epoch(const std::map<std::string, double>& metrics) override;

 private:
  std::shared_ptr<OptimWrapperBase> optim_wrapper_;
  SchedulerMap schedulers_;
};

}  // namespace lockstep
