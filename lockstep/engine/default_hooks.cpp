#include "lockstep/engine/default_hooks.h"

#include "lockstep/checkpoint/checkpointer.h"
#include "lockstep/core/error.h"
#include "lockstep/hooks/best_checkpointer.h"
#include "lockstep/hooks/eval_hook.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/hooks/iteration_timer.h"
#include "lockstep/hooks/lr_scheduler_hook.h"
#include "lockstep/hooks/periodic_checkpointer.h"
#include "lockstep/hooks/periodic_writer.h"
#include "lockstep/strategy/strategy.h"
#include "lockstep/writers/console_writer.h"
#include "lockstep/writers/json_writer.h"
#include "lockstep/writers/tensorboard_writer.h"

namespace lockstep {
namespace {

// A default hook's section: absent -> defaults; explicit null -> disabled.
// A `type`, if given, must name the hook the slot builds (mmengine configs carry one).
std::optional<Config> slot(const Config& default_hooks, const std::string& key,
                           const std::vector<std::string>& accepted_types) {
  if (default_hooks.is_null()) return Config::map();
  if (!default_hooks.has(key)) return Config::map();
  Config section = default_hooks.at(key);
  if (section.is_null()) return std::nullopt;
  LOCKSTEP_CHECK(section.is_map(), section.where(), ": default_hooks.", key, " must be a map or null");
  if (section.has("type")) {
    const std::string type = section.get<std::string>("type");
    bool known = false;
    std::string names;
    for (const auto& accepted : accepted_types) {
      known = known || accepted == type;
      names += (names.empty() ? "" : ", ") + accepted;
    }
    LOCKSTEP_CHECK(known, section.where("type"), ": default_hooks.", key, " builds a ", accepted_types.front(),
                   "; type '", type, "' does not fit this slot (accepted: ", names,
                   "); put other hooks in custom_hooks");
  }
  return section;
}

}  // namespace

std::vector<std::shared_ptr<Hook>> build_default_hooks(const Config& default_hooks, const Config& custom_hooks,
                                                       const DefaultHookSettings& settings) {
  std::vector<std::shared_ptr<Hook>> hooks;
  const bool main_process = settings.strategy->is_main_process();

  if (auto timer = slot(default_hooks, "timer", {"IterationTimer", "IterTimerHook"})) {
    hooks.push_back(std::make_shared<IterationTimer>(timer->get<int64_t>("warmup_iters", 3)));
    timer->check_all_used("default_hooks.timer");
  }
  // Schedulers step every iteration; the hook is not optional when schedulers exist.
  if (auto scheduler = slot(default_hooks, "param_scheduler", {"LRSchedulerHook", "ParamSchedulerHook"})) {
    hooks.push_back(std::make_shared<LRSchedulerHook>(settings.strategy->optim_wrapper(), settings.strategy->schedulers()));
    scheduler->check_all_used("default_hooks.param_scheduler");
  }

  if (!custom_hooks.is_null()) {
    LOCKSTEP_CHECK(custom_hooks.is_sequence(), custom_hooks.where(), ": custom_hooks must be a list of {type: ...} maps");
    HookContext context{settings.strategy, settings.checkpointer, settings.work_dir, settings.iters_per_epoch,
                        settings.max_iters, settings.evaluate};
    for (size_t i = 0; i < custom_hooks.size(); ++i) hooks.push_back(hook_registry().build(custom_hooks.at(i), context));
  }

  std::optional<Config> checkpoint = slot(default_hooks, "checkpoint", {"PeriodicCheckpointer", "CheckpointHook"});
  std::string save_best;
  std::string rule = "greater";
  if (checkpoint) {
    const bool by_epoch = checkpoint->get<bool>("by_epoch", true);
    int64_t interval = checkpoint->get<int64_t>("interval", 1);
    LOCKSTEP_CHECK(interval >= 1, checkpoint->where("interval"), ": interval must be at least 1, got ", interval);
    if (by_epoch) interval *= settings.iters_per_epoch;
    const int64_t max_keep = checkpoint->get<int64_t>("max_keep_ckpts", -1);
    LOCKSTEP_CHECK(max_keep == -1 || max_keep >= 1, checkpoint->where("max_keep_ckpts"),
                   ": max_keep_ckpts must be -1 (keep all) or at least 1, got ", max_keep);
    hooks.push_back(std::make_shared<PeriodicCheckpointer>(settings.checkpointer, interval, max_keep,
                                                           checkpoint->get<std::string>("file_prefix", "model"),
                                                           checkpoint->get<bool>("save_last", true)));
    save_best = checkpoint->get<std::string>("save_best", "");
    rule = checkpoint->get<std::string>("rule", "greater");
    LOCKSTEP_CHECK(rule == "greater" || rule == "less", checkpoint->where("rule"),
                   ": rule must be 'greater' or 'less', got '", rule, "'");
    checkpoint->check_all_used("default_hooks.checkpoint");
  }

  if (settings.evaluate) {
    hooks.push_back(std::make_shared<EvalHook>(settings.val_interval, settings.evaluate,
                                               [strategy = settings.strategy] { strategy->barrier(); }));
    if (!save_best.empty()) {
      hooks.push_back(std::make_shared<BestCheckpointer>(settings.val_interval, settings.checkpointer, save_best,
                                                         rule == "greater" ? "max" : "min"));
    }
  } else {
    LOCKSTEP_CHECK(save_best.empty(), default_hooks.where("checkpoint"),
                   ": save_best needs evaluation, but the config has no val_dataloader");
  }

  if (auto writer = slot(default_hooks, "logger", {"PeriodicWriter", "LoggerHook"})) {
    const int64_t interval = writer->get<int64_t>("interval", 20);
    const int64_t window = writer->get<int64_t>("window", 20);
    LOCKSTEP_CHECK(interval >= 1, writer->where("interval"), ": interval must be at least 1, got ", interval);
    const bool tensorboard = writer->get<bool>("tensorboard", false);
    writer->check_all_used("default_hooks.logger");
    // Only rank 0 writes the console and the metrics file.
    if (main_process) {
      std::vector<std::shared_ptr<EventWriter>> writers{
          std::make_shared<ConsoleWriter>(static_cast<size_t>(window)),
          std::make_shared<JsonWriter>(settings.work_dir + "/metrics.jsonl", static_cast<size_t>(window))};
      if (tensorboard) writers.push_back(std::make_shared<TensorBoardWriter>(settings.work_dir, static_cast<size_t>(window)));
      hooks.push_back(std::make_shared<PeriodicWriter>(writers, interval));
    }
  }
  if (!default_hooks.is_null()) default_hooks.check_all_used("default_hooks");
  return hooks;
}

}  // namespace lockstep
