// Parameter schedulers: lr and momentum schedules with mmengine's semantics.
//
// A ParamScheduler changes one option ("lr", "momentum" or "weight_decay") of
// every param group of an optimizer, once per iteration (the LR scheduler hook
// calls step() after each training iteration). Config, as in mmengine:
//
//   param_scheduler:
//     - {type: LinearLR, start_factor: 0.001, by_epoch: false, begin: 0, end: 500}
//     - {type: CosineAnnealingLR, by_epoch: false, begin: 500, eta_min_ratio: 0.01}
//
//   lockstep::SchedulerContext context;            // ONE per optimizer, shared by its schedulers
//   context.iters_per_epoch = loader.size();
//   context.max_iters = max_iters;
//   for (size_t i = 0; i < cfg.size(); ++i)
//     schedulers.push_back(lockstep::scheduler_registry().build(cfg.at(i), optimizer, context));
//   ... after each iteration: for (auto& s : schedulers) s->step();
//
// Semantics reproduced from mmengine's _ParamScheduler:
// - Construction applies step 0: a scheduler whose `begin` is 0 changes the
//   option at once (LinearLR multiplies lr by start_factor before the first
//   iteration). So the value used in iteration i is the one after i calls of
//   step() that follow construction.
// - A scheduler acts while begin <= i < end; outside it leaves the option alone.
//   Its step count k = i - begin restarts at `begin`.
// - Formulas are chainable: each computes the new value from the group's current
//   value, so schedulers active on the same group compose multiplicatively
//   (CosineAnnealing and CosineRestart bend towards eta_min the same way).
// - Each group's value before any scheduler touched it (mmengine's
//   `initial_lr`) is recorded once per optimizer, in the SchedulerContext, and
//   is the `base` of eta_min_ratio, the cosine half-period correction and
//   CosineRestart's peaks. OneCycleLR overwrites it with eta_max / div_factor.
// - by_epoch (default true) means begin, end and period-like options (T_max,
//   step_size, milestones, total_steps, periods) are in epochs; they are
//   converted to iterations with iters_per_epoch (mmengine's
//   convert_to_iter_based). `end` defaults to max_iters (unbounded when 0).
//
// Resume: build the schedulers from the config as for a fresh run, then load
// the optimizer's state, then each scheduler's state (mmengine's order).
// load_state() refuses a state whose schedule (type, range, options) differs
// from the config's, rather than silently mixing two schedules.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>
#include <nlohmann/json.hpp>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "lockstep/config/registry.h"
#include "lockstep/core/error.h"
#include "lockstep/core/state.h"

namespace lockstep {

// mmengine's INF: the `end` of a scheduler that never stops.
constexpr int64_t kUnboundedStep = 1000000000;

// An invalid scheduler option. `key` names the option so that the config
// reader can point at its file and line.
class OptionError : public Error {
 public:
  OptionError(std::string key, const std::string& message) : Error(message), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// Throws OptionError(key, parts...) unless `condition` holds; for rule constructors.
template <typename... Parts>
void check_option(bool condition, const std::string& key, Parts&&... parts) {
  if (!condition) throw OptionError(key, str_cat(std::forward<Parts>(parts)...));
}

// The values each param group had before any scheduler touched them, by
// option name, shared by the schedulers of one optimizer (mmengine stores them
// in the param groups as initial_lr / initial_momentum).
class InitialValues {
 public:
  // The recorded values of `option`, recording `current` first if there are none.
  std::vector<double> get_or_record(const std::string& option, const std::vector<double>& current);
  void set(const std::string& option, std::vector<double> values);

 private:
  std::map<std::string, std::vector<double>> values_;
};

struct SchedulerContext {
  int64_t iters_per_epoch = 1;
  int64_t max_iters = 0;  // the default `end`; 0 means unbounded
  std::shared_ptr<InitialValues> initial_values = std::make_shared<InitialValues>();
};

// Where a scheduler acts, in iterations.
struct ScheduleSpan {
  TORCH_ARG(std::string, param) = "lr";  // "lr", "momentum" or "weight_decay"
  TORCH_ARG(int64_t, begin) = 0;
  TORCH_ARG(int64_t, end) = kUnboundedStep;
};

// One schedule's formula. Subclasses validate their options in their
// constructor (throwing OptionError) and are immutable after prepare().
class ScheduleRule {
 public:
  virtual ~ScheduleRule() = default;
  // "Linear", "CosineAnnealing", ...: the type name without its LR/Momentum suffix.
  virtual std::string name() const = 0;
  // The options that define the schedule, saved with the state and compared on load.
  virtual nlohmann::json options() const = 0;
  // Called once before step 0 with the span and each group's initial value
  // (which a rule that defines its own start may overwrite). Derives what
  // depends on the span; throws OptionError when the options do not fit it.
  virtual void prepare(const ScheduleSpan& span, std::vector<double>& initial) {}
  // The chainable formula: the value of group `group` at step `step` (0 at
  // `begin`) from its current value and its initial value `base`.
  virtual double value(int64_t step, size_t group, double current, double base) const = 0;
};

class ParamScheduler {
 public:
  // Validates the span (0 <= begin < end), records the initial values in
  // `context` and applies step 0. Throws OptionError on bad options.
  ParamScheduler(torch::optim::Optimizer& optimizer, std::unique_ptr<ScheduleRule> rule,
                 const ScheduleSpan& span, const SchedulerContext& context = SchedulerContext());
  virtual ~ParamScheduler() = default;
  C10_DISABLE_COPY_AND_ASSIGN(ParamScheduler);

  // Advances one iteration and applies the schedule.
  void step();
  // After each validation pass, with its metrics: what a schedule driven by
  // a metric (ReduceOnPlateauLR) acts on. Others ignore it.
  virtual void step_with_metrics(const std::map<std::string, double>& /*metrics*/) {}
  // Steps taken inside [begin, end): 0 after construction when begin == 0, -1
  // while the scheduler has not begun.
  int64_t last_step() const { return last_step_; }
  // The scheduled option of every group after the last step().
  std::vector<double> last_values() const { return last_values_; }

  // "LinearLR", "CosineAnnealingMomentum", "Poly(weight_decay)".
  std::string name() const;
  const std::string& param() const { return span_.param(); }
  int64_t begin() const { return span_.begin(); }
  int64_t end() const { return span_.end(); }
  const ScheduleRule& rule() const { return *rule_; }

  virtual State state() const;
  virtual void load_state(const State& state);

  // Replaying (replay_schedulers below): whether the schedule depends on
  // iterations only (a metric-driven one does not), and going back to the
  // moment before construction's step 0: the option's values as found then,
  // the step counts at their start.
  virtual bool replayable() const { return true; }
  void rewind();

 protected:
  torch::optim::Optimizer& optimizer() const { return optimizer_; }
  int64_t global_step() const { return global_step_; }
  // After a subclass changed the option outside step().
  void record_last_values();

 private:
  torch::optim::Optimizer& optimizer_;
  std::unique_ptr<ScheduleRule> rule_;
  ScheduleSpan span_;
  std::vector<double> base_values_;
  std::vector<double> start_values_;  // the option's values before construction's step 0
  std::vector<double> last_values_;
  int64_t last_step_ = -1;
  int64_t global_step_ = -1;  // calls of step(), construction's included, minus one
};

// Types: ConstantLR, LinearLR, StepLR, MultiStepLR, ExponentialLR,
// CosineAnnealingLR, PolyLR, OneCycleLR, CosineRestartLR, ReduceOnPlateauLR
// (schedulers_plateau.h), and the *Momentum twin of each but OneCycle.
// Common keys: begin, end, by_epoch, param.
Registry<ParamScheduler, torch::optim::Optimizer&, const SchedulerContext&>& scheduler_registry();

// Puts `schedulers` (those of one optimizer, in the order they were built and
// are stepped) where they would be after `steps` iterations of an
// uninterrupted run: rewound, then construction's step 0 and `steps` steps
// replayed, as the LR scheduler hook makes them. The option values follow.
// For a run resumed where saved step counts mean other iterations (another
// world size). Throws naming a scheduler that cannot be replayed.
void replay_schedulers(const std::vector<std::shared_ptr<ParamScheduler>>& schedulers, int64_t steps);

}  // namespace lockstep
