#include "lockstep/hooks/best_checkpointer.h"

#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

BestCheckpointer::BestCheckpointer(int64_t eval_period, std::shared_ptr<Checkpointer> checkpointer, std::string metric,
                                   std::string mode, std::string file_prefix)
    : Hook("BestCheckpointer"),
      eval_period_(eval_period),
      checkpointer_(std::move(checkpointer)),
      metric_(std::move(metric)),
      maximize_(mode == "max"),
      file_prefix_(std::move(file_prefix)) {
  LOCKSTEP_CHECK(mode == "max" || mode == "min", "BestCheckpointer mode must be 'max' or 'min', got '", mode, "'");
  LOCKSTEP_CHECK(eval_period_ >= 1, "BestCheckpointer eval_period must be at least 1, got ", eval_period_);
}

void BestCheckpointer::check_best() {
  auto latest = trainer().storage().latest();
  auto found = latest.find(metric_);
  if (found == latest.end()) {
    logger().warn("BestCheckpointer: no metric '{}' was recorded by the evaluation; nothing to compare", metric_);
    return;
  }
  // Only a fresh evaluation result counts.
  if (found->second.iteration == last_checked_iter_) return;
  last_checked_iter_ = found->second.iteration;
  const double value = found->second.value;
  if (std::isnan(value)) {
    logger().warn("BestCheckpointer: '{}' is NaN at iteration {}; skipped", metric_, found->second.iteration);
    return;
  }
  const bool better = !best_value_ || (maximize_ ? value > *best_value_ : value < *best_value_);
  if (!better) {
    logger().info("BestCheckpointer: {} = {:.5f} is not better than {:.5f} (iteration {})", metric_, value,
                  *best_value_, best_iter_);
    return;
  }
  best_value_ = value;
  best_iter_ = found->second.iteration;
  checkpointer_->save(file_prefix_, trainer());
  logger().info("BestCheckpointer: new best {} = {:.5f} at iteration {}; saved {}", metric_, value, best_iter_,
                file_prefix_);
}

void BestCheckpointer::after_step() {
  const int64_t next = trainer().iter() + 1;
  if (next % eval_period_ == 0 && next != trainer().max_iter()) check_best();
}

void BestCheckpointer::after_train() {
  if (trainer().iter() >= trainer().max_iter()) check_best();
}

State BestCheckpointer::state() const {
  State state;
  if (best_value_) state.values["best_value"] = *best_value_;
  state.values["best_iter"] = best_iter_;
  return state;
}

void BestCheckpointer::load_state(const State& state) {
  best_value_.reset();
  if (state.values.contains("best_value")) best_value_ = state.values.at("best_value").get<double>();
  best_iter_ = state.values.value("best_iter", int64_t{-1});
}

// {metric: accuracy/top1, rule: greater | less}; checks after each evaluation.
LOCKSTEP_REGISTER(hook_registry(), "BestCheckpointer", [](const Config& config, const HookContext& context) {
  LOCKSTEP_CHECK(context.evaluate != nullptr && context.val_interval > 0, config.where(),
                 ": BestCheckpointer (save_best) needs evaluation, but the config has no val_dataloader");
  const std::string rule = config.get<std::string>("rule", "greater");
  LOCKSTEP_CHECK(rule == "greater" || rule == "less", config.where("rule"), ": rule must be 'greater' or 'less', got '",
                 rule, "'");
  return std::make_shared<BestCheckpointer>(context.val_interval, context.checkpointer,
                                            config.get<std::string>("metric"), rule == "greater" ? "max" : "min");
});

}  // namespace lockstep
