// The hooks every run gets, built from `default_hooks` and `custom_hooks`.
//
// Order (detectron2's): IterationTimer, LRSchedulerHook, custom hooks,
// PeriodicCheckpointer, EvalHook, BestCheckpointer, PeriodicWriter -- so the
// timer measures everything, the writer publishes everything, and the best
// checkpointer sees fresh evaluation results.
//
//   default_hooks:
//     timer: {warmup_iters: 3}                 # null disables a default hook
//     logger: {interval: 50, window: 20}       # console + <work_dir>/metrics.jsonl
//     checkpoint: {interval: 1, by_epoch: true, max_keep_ckpts: 3, save_last: true,
//                  save_best: accuracy/top1, rule: greater}
//   custom_hooks:
//     - {type: MyHook, period: 100}
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/engine/hook.h"

namespace lockstep {

class Checkpointer;
class Strategy;

struct DefaultHookSettings {
  std::shared_ptr<Strategy> strategy;
  std::shared_ptr<Checkpointer> checkpointer;
  std::string work_dir;
  int64_t iters_per_epoch = 1;
  int64_t max_iters = 0;
  int64_t val_interval = 0;  // in iterations; 0: no periodic evaluation
  std::function<std::map<std::string, double>()> evaluate;  // null: no val set
};

std::vector<std::shared_ptr<Hook>> build_default_hooks(const Config& default_hooks, const Config& custom_hooks,
                                                       const DefaultHookSettings& settings);

}  // namespace lockstep
