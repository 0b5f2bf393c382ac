#include "lockstep/hooks/early_stopping.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/spelling.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

EarlyStoppingHook::EarlyStoppingHook(Options options, std::function<bool(bool)> agree)
    : Hook("EarlyStoppingHook", kLowest), options_(std::move(options)), agree_(std::move(agree)) {
  LOCKSTEP_CHECK(!options_.monitor.empty(), "EarlyStoppingHook: `monitor` names the metric to watch");
  LOCKSTEP_CHECK(options_.rule == "greater" || options_.rule == "less", "EarlyStoppingHook: rule must be 'greater' or 'less', got '",
                 options_.rule, "'");
  LOCKSTEP_CHECK(options_.patience >= 1, "EarlyStoppingHook: patience must be at least 1, got ", options_.patience);
  // mmengine stores min_delta signed by the rule.
  if (options_.rule == "less") options_.min_delta = -options_.min_delta;
  best_score_ = options_.rule == "greater" ? -std::numeric_limits<double>::infinity()
                                           : std::numeric_limits<double>::infinity();
}

std::string EarlyStoppingHook::default_rule(const std::string& monitor) {
  for (const char* key : {"acc", "top", "AR@", "auc", "precision", "mAP", "mDice", "mIoU", "mAcc", "aAcc"}) {
    if (monitor.find(key) != std::string::npos) return "greater";
  }
  if (monitor.find("loss") != std::string::npos) return "less";
  return "";
}

bool EarlyStoppingHook::check_stop(double score, std::string* reason) {
  auto better = [&](double a, double b) { return options_.rule == "greater" ? a > b : a < b; };
  if (options_.check_finite && !std::isfinite(score)) {
    *reason = fmt::format("monitored metric {} = {} is infinite; previous best value was {:.3f}", options_.monitor,
                          score, best_score_);
    return true;
  }
  if (options_.stopping_threshold && better(score, *options_.stopping_threshold)) {
    best_score_ = score;
    *reason = fmt::format("stopping threshold reached: {} = {} is {} than {}", options_.monitor, score,
                          options_.rule, *options_.stopping_threshold);
    return true;
  }
  if (better(best_score_ + options_.min_delta, score)) {
    ++wait_count_;
    if (wait_count_ >= options_.patience) {
      *reason = fmt::format("the monitored metric {} did not improve in the last {} records; best score: {:.3f}",
                            options_.monitor, wait_count_, best_score_);
      return true;
    }
    return false;
  }
  best_score_ = score;
  wait_count_ = 0;
  return false;
}

void EarlyStoppingHook::before_train() {
  // A run resumed after it stopped early stays stopped.
  if (stopped_) trainer().stop().request("it stopped early before it was resumed (" + stop_reason_ + ")");
}

void EarlyStoppingHook::after_val_epoch(const std::map<std::string, double>& metrics) {
  if (stopped_) return;
  auto found = metrics.find(options_.monitor);
  bool stop = false;
  std::string reason;
  if (found == metrics.end()) {
    const std::string names = known_names(metrics);
    LOCKSTEP_CHECK(!options_.strict, "EarlyStoppingHook: the validation metrics hold no '", options_.monitor,
                   "' (they are: ", names, ")");
    logger().warn("EarlyStoppingHook: the validation metrics hold no '{}' (they are: {}); not checked",
                  options_.monitor, names);
  } else {
    stop = check_stop(found->second, &reason);
  }
  // Every rank takes a stop any rank decided, so that none trains on alone.
  if (agree_) stop = agree_(stop);
  if (!stop) return;
  stopped_ = true;
  stop_reason_ = reason.empty() ? "another rank stopped" : reason;
  trainer().stop().request(stop_reason_);
}

State EarlyStoppingHook::state() const {
  State state;
  state.values["wait_count"] = wait_count_;
  if (std::isfinite(best_score_)) state.values["best_score"] = best_score_;  // JSON has no infinity
  state.values["stopped"] = stopped_;
  state.values["reason"] = stop_reason_;
  return state;
}

void EarlyStoppingHook::load_state(const State& state) {
  wait_count_ = state.values.at("wait_count").get<int64_t>();
  if (state.values.contains("best_score")) best_score_ = state.values.at("best_score").get<double>();
  stopped_ = state.values.at("stopped").get<bool>();
  stop_reason_ = state.values.value("reason", std::string());
}

LOCKSTEP_REGISTER(hook_registry(), "EarlyStoppingHook", [](const Config& cfg, const HookContext& context) {
  EarlyStoppingHook::Options options;
  options.monitor = cfg.get<std::string>("monitor");
  options.rule = cfg.get<std::string>("rule", EarlyStoppingHook::default_rule(options.monitor));
  LOCKSTEP_CHECK(options.rule == "greater" || options.rule == "less", cfg.where("rule"),
                 ": rule must be 'greater' or 'less'",
                 options.rule.empty() ? str_cat(" (it cannot be guessed from the name '", options.monitor, "')")
                                      : str_cat(", got '", options.rule, "'"));
  options.min_delta = cfg.get<double>("min_delta", 0.1);
  options.patience = cfg.get<int64_t>("patience", 5);
  LOCKSTEP_CHECK(options.patience >= 1, cfg.where("patience"), ": patience must be at least 1");
  if (cfg.has("stopping_threshold") && !cfg.at("stopping_threshold").is_null()) {
    options.stopping_threshold = cfg.get<double>("stopping_threshold");
  }
  options.strict = cfg.get<bool>("strict", false);
  options.check_finite = cfg.get<bool>("check_finite", true);
  LOCKSTEP_CHECK(context.evaluate != nullptr, cfg.where(), ": EarlyStoppingHook watches validation metrics, but the "
                                                           "config has no val_dataloader");
  std::function<bool(bool)> agree;
  if (context.collectives->world_size() > 1) {
    std::shared_ptr<Collectives> ranks = context.collectives;
    agree = [ranks](bool stop) { return ranks->any_rank(stop); };
  }
  return std::make_shared<EarlyStoppingHook>(options, agree);
});

}  // namespace lockstep
