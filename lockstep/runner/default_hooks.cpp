#include "lockstep/runner/default_hooks.h"

#include <algorithm>
#include <optional>
#include <string>

#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// A default hook's slot: the key under default_hooks, the type it builds and
// the other names that type goes by.
struct Slot {
  const char* key;
  std::vector<std::string> types;  // the first is the default
  int priority;
};

// Priorities keep the default hooks in this order around the custom hooks
// (NORMAL unless they say otherwise): timer, schedulers, custom hooks,
// periodic checkpoints, evaluation, best checkpoint, logger.
const Slot kTimer{"timer", {"IterationTimer", "IterTimerHook"}, kVeryHigh};
const Slot kScheduler{"param_scheduler", {"LRSchedulerHook", "ParamSchedulerHook"}, kHigh};
const Slot kCheckpoint{"checkpoint", {"PeriodicCheckpointer", "CheckpointHook"}, kBelowNormal};
const Slot kLogger{"logger", {"PeriodicWriter", "LoggerHook"}, kLowest};
// After the logger: the bar shows what the step just recorded.
const Slot kProgress{"progress", {"ProgressBarHook"}, kLowest};
constexpr int kEvalPriority = kLow;
constexpr int kBestCheckpointPriority = kVeryLow;

// A `priority` key (a name such as VERY_HIGH, or a number), else `fallback`.
int read_priority(const Config& section, int fallback) {
  if (!section.has("priority")) return fallback;
  try {
    return parse_hook_priority(section.get<std::string>("priority"));
  } catch (const Error& error) {
    LOCKSTEP_FAIL(section.where("priority"), ": ", error.what());
  }
}

std::shared_ptr<Hook> with_priority(std::shared_ptr<Hook> hook, int priority) {
  hook->set_priority(priority);
  return hook;
}

// A slot's section: absent -> the defaults; null or false -> disabled.
// (`--set default_hooks.X=null` removes the key, as every null override
// does, so the command line turns a slot off with false.)
std::optional<Config> section_of(const Config& default_hooks, const Slot& slot) {
  if (default_hooks.is_null() || !default_hooks.has(slot.key)) return Config::map();
  Config section = default_hooks.at(slot.key);
  if (section.is_null()) return std::nullopt;
  if (section.is_scalar() && section.text() == "false") {
    mark_used(section);
    return std::nullopt;
  }
  LOCKSTEP_CHECK(section.is_map(), section.where(), ": default_hooks.", slot.key, " must be a map, null or false");
  return section;
}

// Builds the slot's hook through the registry; a `type`, if given, must name it.
std::shared_ptr<Hook> build_slot(const Slot& slot, const Config& section, const HookContext& context) {
  std::string type = slot.types.front();
  if (section.has("type")) {
    type = section.get<std::string>("type");
    std::string names;
    for (const auto& accepted : slot.types) names += (names.empty() ? "" : ", ") + accepted;
    LOCKSTEP_CHECK(std::find(slot.types.begin(), slot.types.end(), type) != slot.types.end(), section.where("type"),
                   ": default_hooks.", slot.key, " builds a ", slot.types.front(), "; type '", type,
                   "' does not fit this slot (accepted: ", names, "); put other hooks in custom_hooks");
  }
  const int priority = read_priority(section, slot.priority);
  return with_priority(hook_registry().build_as(type, section, context), priority);
}

// A hook the runner adds by itself: {type: TYPE} plus `fields`, nodes of the
// user's config (so that their errors name the user's file and line).
std::shared_ptr<Hook> build_internal(const std::string& type, const std::vector<std::pair<std::string, Config>>& fields,
                                     const HookContext& context, int priority) {
  Config config = Config::map();
  config.set("type", Config::scalar(type));
  for (const auto& [key, value] : fields) config.set(key, value);
  return with_priority(hook_registry().build(config, context), priority);
}

}  // namespace

std::vector<std::shared_ptr<Hook>> build_default_hooks(const Config& default_hooks, const Config& custom_hooks,
                                                       const HookContext& context) {
  if (!default_hooks.is_null()) {
    LOCKSTEP_CHECK(default_hooks.is_map(), default_hooks.where(), ": default_hooks must be a map of slots");
    check_known_keys(default_hooks, {kTimer.key, kScheduler.key, kCheckpoint.key, kLogger.key, kProgress.key},
                                   "default hook slot");
  }
  std::vector<std::shared_ptr<Hook>> hooks;
  if (auto timer = section_of(default_hooks, kTimer)) hooks.push_back(build_slot(kTimer, *timer, context));
  if (auto scheduler = section_of(default_hooks, kScheduler)) {
    hooks.push_back(build_slot(kScheduler, *scheduler, context));
  }

  if (!custom_hooks.is_null()) {
    LOCKSTEP_CHECK(custom_hooks.is_sequence(), custom_hooks.where(), ": custom_hooks must be a list of {type: ...} maps");
    for (size_t i = 0; i < custom_hooks.size(); ++i) {
      const Config section = custom_hooks.at(i);
      const int priority = section.is_map() ? read_priority(section, kNormal) : kNormal;
      hooks.push_back(with_priority(hook_registry().build(section, context), priority));
    }
  }

  // save_best and rule belong to BestCheckpointer; the rest of the section to PeriodicCheckpointer.
  std::vector<std::pair<std::string, Config>> best;
  if (auto checkpoint = section_of(default_hooks, kCheckpoint)) {
    Config periodic = checkpoint->clone();
    const std::string rule = checkpoint->get<std::string>("rule", "greater");
    LOCKSTEP_CHECK(rule == "greater" || rule == "less", checkpoint->where("rule"),
                   ": rule must be 'greater' or 'less', got '", rule, "'");
    if (!checkpoint->get<std::string>("save_best", "").empty()) {
      best.emplace_back("metric", checkpoint->at("save_best"));
      if (checkpoint->has("rule")) best.emplace_back("rule", checkpoint->at("rule"));
    }
    for (const char* key : {"save_best", "rule"}) {
      if (periodic.has(key)) periodic.erase(key);
    }
    hooks.push_back(build_slot(kCheckpoint, periodic, context));
  }
  if (context.evaluate) hooks.push_back(build_internal("EvalHook", {}, context, kEvalPriority));
  if (!best.empty()) {
    LOCKSTEP_CHECK(context.evaluate != nullptr, default_hooks.where("checkpoint"),
                   ": save_best needs evaluation, but the config has no val_dataloader");
    hooks.push_back(build_internal("BestCheckpointer", best, context, kBestCheckpointPriority));
  }

  if (auto logger = section_of(default_hooks, kLogger)) hooks.push_back(build_slot(kLogger, *logger, context));
  if (auto progress = section_of(default_hooks, kProgress)) hooks.push_back(build_slot(kProgress, *progress, context));
  return hooks;
}

}  // namespace lockstep
