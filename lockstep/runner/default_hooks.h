// The hooks every run gets, built from `default_hooks` and `custom_hooks`.
//
// Order (detectron2's): IterationTimer, LRSchedulerHook, custom hooks,
// PeriodicCheckpointer, EvalHook, BestCheckpointer, PeriodicWriter,
// ProgressBarHook -- so the timer measures everything, the writer publishes
// everything, the best checkpointer sees fresh evaluation results, and the
// bar shows what the step recorded.
//
//   default_hooks:
//     timer: {warmup_iters: 3}                 # null or false disables a default hook
//                                              # (on the command line: --set default_hooks.timer=false)
//     logger: {interval: 50, window: 20}       # console + <work_dir>/metrics.jsonl
//     progress: {refresh_s: 0.25}              # a live bar on a terminal only (hooks/progress_bar_hook.h)
//     checkpoint: {interval: 1, by_epoch: true, max_keep_ckpts: 3, save_last: true,
//                  save_best: accuracy/top1, rule: greater}
//   custom_hooks:
//     - {type: MyHook, period: 100}
//
// Every hook is built through the hook registry (hooks/hook_registry.h): a
// default slot names the type it builds when its section has none (and
// refuses a type that does not fit the slot), so each hook's keys and
// defaults live in one place, its factory.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/engine/hook.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

std::vector<std::shared_ptr<Hook>> build_default_hooks(const Config& default_hooks, const Config& custom_hooks,
                                                       const HookContext& context);

}  // namespace lockstep
