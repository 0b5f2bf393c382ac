// The registry of hooks that configs can name, and what their factories get.
//
// Configs list hooks under `custom_hooks`, and `default_hooks` configures the
// hooks every run gets (runner/default_hooks.h); both build through here, so a
// hook's keys and defaults live in its factory, in its own .cpp:
//   custom_hooks:
//     - {type: MyHook, period: 100}
// A factory receives its config and a HookContext with the run's pieces:
//
//   LOCKSTEP_REGISTER(lockstep::hook_registry(), "MyHook",
//       [](const lockstep::Config& cfg, const lockstep::HookContext& ctx) {
//         return std::make_shared<MyHook>(cfg.get<int64_t>("period", 100));
//       });
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "lockstep/config/registry.h"
#include "lockstep/engine/hook.h"
#include "lockstep/events/log_processor.h"
#include "lockstep/strategy/collectives.h"

namespace lockstep {

class Checkpointer;
class Strategy;

// The run's pieces a hook may need; every hook, default or custom, is built
// from its config and this.
struct HookContext {
  std::shared_ptr<Strategy> strategy;
  // The ranks of the run (Strategy::collectives()); one process unless set.
  std::shared_ptr<Collectives> collectives = std::make_shared<Collectives>();
  std::shared_ptr<Checkpointer> checkpointer;
  std::string work_dir;
  int64_t iters_per_epoch = 1;
  bool by_epoch = false;  // train_cfg counts epochs
  int64_t max_iters = 0;
  int64_t val_interval = 0;  // iterations between evaluations; 0: none
  // What the logger's writers log for each scalar (the run's log_processor).
  LogProcessor log_processor = LogProcessor::detectron2();
  // Runs a validation pass and returns its metrics; null without a val set.
  std::function<std::map<std::string, double>()> evaluate;
};

Registry<Hook, const HookContext&>& hook_registry();

}  // namespace lockstep
