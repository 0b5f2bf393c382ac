#include "lockstep/optim/schedulers_plateau.h"

#include <cmath>
#include <limits>

#include "lockstep/core/spelling.h"
#include "lockstep/optim/param_groups.h"

namespace lockstep {
namespace {

// The schedule's formula leaves the value alone: only step_with_metrics changes it.
class PlateauRule : public ScheduleRule {
 public:
  explicit PlateauRule(const PlateauOptions& options) : options_(options) {}
  std::string name() const override { return "ReduceOnPlateau"; }
  nlohmann::json options() const override {
    return {{"monitor", options_.monitor()},     {"rule", options_.rule()},           {"factor", options_.factor()},
            {"patience", options_.patience()},   {"threshold", options_.threshold()}, {"threshold_rule", options_.threshold_rule()},
            {"cooldown", options_.cooldown()},   {"min_value", options_.min_value()}, {"eps", options_.eps()}};
  }
  double value(int64_t, size_t, double current, double) const override { return current; }

 private:
  PlateauOptions options_;
};

const PlateauOptions& checked(const PlateauOptions& options) {
  check_option(options.rule() == "less" || options.rule() == "greater", "rule", "rule must be 'less' or 'greater', got '",
               options.rule(), "'");
  check_option(options.threshold_rule() == "rel" || options.threshold_rule() == "abs", "threshold_rule",
               "threshold_rule must be 'rel' or 'abs', got '", options.threshold_rule(), "'");
  check_option(options.factor() < 1.0 && options.factor() >= 0.0, "factor", "factor must be in [0, 1), got ",
               options.factor());
  check_option(options.patience() >= 0, "patience", "patience must be non-negative, got ", options.patience());
  check_option(options.cooldown() >= 0, "cooldown", "cooldown must be non-negative, got ", options.cooldown());
  check_option(!options.min_value().empty(), "min_value", "min_value needs a value");
  check_option(options.monitor() != "", "monitor", "monitor names the metric to watch");
  return options;
}

}  // namespace

ReduceOnPlateauScheduler::ReduceOnPlateauScheduler(torch::optim::Optimizer& optimizer, PlateauOptions options,
                                                   const ScheduleSpan& span, const SchedulerContext& context)
    : ParamScheduler(optimizer, std::make_unique<PlateauRule>(checked(options)), span, context),
      options_(std::move(options)) {
  const size_t groups = optimizer.param_groups().size();
  check_option(options_.min_value().size() == 1 || options_.min_value().size() == groups, "min_value",
               "min_value has ", options_.min_value().size(), " values for ", groups, " param groups");
  best_ = options_.rule() == "less" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

bool ReduceOnPlateauScheduler::is_better(double value) const {
  const double threshold = options_.threshold();
  if (options_.rule() == "less") {
    return options_.threshold_rule() == "rel" ? value < best_ * (1.0 - threshold) : value < best_ - threshold;
  }
  return options_.threshold_rule() == "rel" ? value > best_ * (threshold + 1.0) : value > best_ + threshold;
}

void ReduceOnPlateauScheduler::step_with_metrics(const std::map<std::string, double>& metrics) {
  // Acts inside [begin, end) of the iterations taken so far.
  if (global_step() < begin() || global_step() >= end()) return;
  auto found = metrics.find(options_.monitor());
  if (found == metrics.end()) {
    LOCKSTEP_FAIL(name(), ": the validation metrics hold no '", options_.monitor(), "' to monitor (they are: ",
                  known_names(metrics), ")");
  }
  const double value = found->second;
  if (is_better(value)) {
    best_ = value;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad passes in cooldown do not count
  }
  if (num_bad_epochs_ > options_.patience()) {
    torch::optim::Optimizer& opt = optimizer();
    for (size_t g = 0; g < opt.param_groups().size(); ++g) {
      const double old_value = get_group_option(opt, g, param());
      const double floor = options_.min_value()[options_.min_value().size() == 1 ? 0 : g];
      const double new_value = std::max(old_value * options_.factor(), floor);
      if (old_value - new_value > options_.eps()) set_group_option(opt, g, param(), new_value);
    }
    cooldown_counter_ = options_.cooldown();
    num_bad_epochs_ = 0;
  }
  record_last_values();
}

State ReduceOnPlateauScheduler::state() const {
  State state = ParamScheduler::state();
  state.values["plateau"] = {{"num_bad_epochs", num_bad_epochs_}, {"cooldown_counter", cooldown_counter_}};
  // JSON has no infinity: the best before any pass is left out.
  if (std::isfinite(best_)) state.values["plateau"]["best"] = best_;
  return state;
}

void ReduceOnPlateauScheduler::load_state(const State& state) {
  ParamScheduler::load_state(state);
  LOCKSTEP_CHECK(state.values.contains("plateau"), name(), ": the scheduler state lacks its plateau counters");
  const auto& plateau = state.values.at("plateau");
  best_ = plateau.contains("best") ? plateau.at("best").get<double>()
                                   : (options_.rule() == "less" ? std::numeric_limits<double>::infinity()
                                                                : -std::numeric_limits<double>::infinity());
  num_bad_epochs_ = plateau.at("num_bad_epochs").get<int64_t>();
  cooldown_counter_ = plateau.at("cooldown_counter").get<int64_t>();
}

}  // namespace lockstep
