// Builds schedulers from config: reads each type's keys into its options
// struct, converting epoch-based numbers to iterations, and registers every
// type as "<Family>LR" and "<Family>Momentum" from one table.
#include <optional>

#include "lockstep/optim/param_scheduler.h"
#include "lockstep/optim/schedulers_annealing.h"
#include "lockstep/optim/schedulers_multiplicative.h"
#include "lockstep/optim/schedulers_plateau.h"

namespace lockstep {
namespace {

// Reads begin/end and period-like keys, in iterations. With by_epoch (the
// default) the config gives them in epochs (mmengine's convert_to_iter_based).
class IterReader {
 public:
  IterReader(const Config& cfg, const SchedulerContext& context) : cfg_(cfg), context_(context) {
    by_epoch_ = cfg.get<bool>("by_epoch", true);
    if (cfg.has("convert_to_iter_based")) {
      LOCKSTEP_CHECK(cfg.get<bool>("convert_to_iter_based"), cfg.where("convert_to_iter_based"),
                     ": lockstep steps schedulers every iteration and always converts by_epoch "
                     "schedules to iterations; convert_to_iter_based can only be true");
    }
    LOCKSTEP_CHECK(!by_epoch_ || context.iters_per_epoch > 0, cfg.where("by_epoch"),
                   ": a by_epoch schedule needs the number of iterations per epoch, got ", context.iters_per_epoch,
                   context.iters_per_epoch == 0 ? " (a run fed through the step API has no epochs: by_epoch: false)"
                                                : "");
  }

  int64_t period(const std::string& key) const { return scale(cfg_.get<int64_t>(key)); }
  std::optional<int64_t> optional_period(const std::string& key) const {
    if (absent(key)) return std::nullopt;
    return period(key);
  }
  std::vector<int64_t> periods(const std::string& key) const {
    std::vector<int64_t> values = cfg_.get<std::vector<int64_t>>(key);
    for (auto& value : values) value = scale(value);
    return values;
  }

  ScheduleSpan span(const std::string& type, const std::string& default_param) const {
    ScheduleSpan span;
    span.param(cfg_.get<std::string>("param", default_param));
    const std::string& param = span.param();
    LOCKSTEP_CHECK(param == "lr" || param == "momentum" || param == "weight_decay", cfg_.where("param"),
                   ": param must be lr, momentum or weight_decay, got '", param, "'");
    LOCKSTEP_CHECK(default_param == "lr" || param == default_param, cfg_.where("param"), ": ", type,
                   " schedules ", default_param, ", so param cannot be '", param, "'");
    span.begin(position("begin", 0));
    if (!absent("end")) {
      span.end(position("end", 0));
    } else if (context_.max_iters > 0) {
      span.end(context_.max_iters);
    }
    return span;
  }

  // A present, non-null key (mmengine configs write `eta_min=None` for "unset").
  bool absent(const std::string& key) const { return !cfg_.has(key) || cfg_.child(key).is_null(); }
  template <typename T>
  std::optional<T> optional(const std::string& key) const {
    if (absent(key)) return std::nullopt;
    return cfg_.get<T>(key);
  }

 private:
  int64_t scale(int64_t value) const { return by_epoch_ ? value * context_.iters_per_epoch : value; }
  // begin/end may be fractional epochs: int(epochs * iters_per_epoch), as mmengine.
  int64_t position(const std::string& key, double fallback) const {
    if (!by_epoch_) return cfg_.get<int64_t>(key, static_cast<int64_t>(fallback));
    return static_cast<int64_t>(cfg_.get<double>(key, fallback) *
                                static_cast<double>(context_.iters_per_epoch));
  }

  const Config& cfg_;
  const SchedulerContext& context_;
  bool by_epoch_ = true;
};

using RuleReader = std::unique_ptr<ScheduleRule> (*)(const Config&, const IterReader&);

struct Family {
  const char* name;
  bool momentum_twin;  // mmengine has no OneCycleMomentum
  RuleReader read;
};

std::vector<double> number_or_list(const Config& node) {
  if (node.is_sequence()) return node.as<std::vector<double>>();
  return {node.as<double>()};
}

const Family kFamilies[] = {
    {"Constant", true,
     [](const Config& cfg, const IterReader&) {
       return make_rule(ConstantOptions().factor(cfg.get<double>("factor", 1.0 / 3)));
     }},
    {"Linear", true,
     [](const Config& cfg, const IterReader&) {
       return make_rule(LinearOptions()
                            .start_factor(cfg.get<double>("start_factor", 1.0 / 3))
                            .end_factor(cfg.get<double>("end_factor", 1.0)));
     }},
    {"Step", true,
     [](const Config& cfg, const IterReader& iters) {
       return make_rule(StepOptions(iters.period("step_size")).gamma(cfg.get<double>("gamma", 0.1)));
     }},
    {"MultiStep", true,
     [](const Config& cfg, const IterReader& iters) {
       return make_rule(MultiStepOptions(iters.periods("milestones")).gamma(cfg.get<double>("gamma", 0.1)));
     }},
    {"Exponential", true,
     [](const Config& cfg, const IterReader&) {
       return make_rule(ExponentialOptions(cfg.get<double>("gamma")));
     }},
    {"CosineAnnealing", true,
     [](const Config& cfg, const IterReader& iters) {
       return make_rule(CosineAnnealingOptions()
                            .T_max(iters.optional_period("T_max"))
                            .eta_min(iters.optional<double>("eta_min"))
                            .eta_min_ratio(iters.optional<double>("eta_min_ratio")));
     }},
    {"Poly", true,
     [](const Config& cfg, const IterReader&) {
       return make_rule(
           PolyOptions().eta_min(cfg.get<double>("eta_min", 0.0)).power(cfg.get<double>("power", 1.0)));
     }},
    {"OneCycle", false,
     [](const Config& cfg, const IterReader& iters) {
       return make_rule(OneCycleOptions(number_or_list(cfg.at("eta_max")))
                            .total_steps(iters.optional_period("total_steps"))
                            .pct_start(cfg.get<double>("pct_start", 0.3))
                            .anneal_strategy(cfg.get<std::string>("anneal_strategy", "cos"))
                            .div_factor(cfg.get<double>("div_factor", 25.0))
                            .final_div_factor(cfg.get<double>("final_div_factor", 1e4))
                            .three_phase(cfg.get<bool>("three_phase", false)));
     }},
    {"CosineRestart", true,
     [](const Config& cfg, const IterReader& iters) {
       return make_rule(CosineRestartOptions(iters.periods("periods"))
                            .restart_weights(cfg.get<std::vector<double>>("restart_weights", {1.0}))
                            .eta_min(iters.optional<double>("eta_min"))
                            .eta_min_ratio(iters.optional<double>("eta_min_ratio")));
     }},
};

std::shared_ptr<ParamScheduler> build(const Family& family, const std::string& type,
                                      const std::string& default_param, const Config& cfg,
                                      torch::optim::Optimizer& optimizer, const SchedulerContext& context) {
  try {
    IterReader iters(cfg, context);
    const ScheduleSpan span = iters.span(type, default_param);
    return std::make_shared<ParamScheduler>(optimizer, family.read(cfg, iters), span, context);
  } catch (const OptionError& error) {
    LOCKSTEP_FAIL(cfg.where(error.key()), ": ", type, ": ", error.what());
  }
}

}  // namespace

Registry<ParamScheduler, torch::optim::Optimizer&, const SchedulerContext&>& scheduler_registry() {
  // Built-ins are added on first use, so no static-initialisation order matters.
  static auto* registry = [] {
    auto* r = new Registry<ParamScheduler, torch::optim::Optimizer&, const SchedulerContext&>(
        "param scheduler");
    for (const Family& family : kFamilies) {
      for (const std::string suffix : {"LR", "Momentum"}) {
        if (suffix == "Momentum" && !family.momentum_twin) continue;
        const std::string type = family.name + suffix;
        const std::string param = suffix == "LR" ? "lr" : "momentum";
        r->add(type, [&family, type, param](const Config& cfg, torch::optim::Optimizer& optimizer,
                                            const SchedulerContext& context) {
          return build(family, type, param, cfg, optimizer, context);
        });
      }
    }
    for (const std::string suffix : {"LR", "Momentum"}) {
      const std::string type = "ReduceOnPlateau" + suffix;
      const std::string param = suffix == "LR" ? "lr" : "momentum";
      r->add(type, [type, param](const Config& cfg, torch::optim::Optimizer& optimizer, const SchedulerContext& context)
                 -> std::shared_ptr<ParamScheduler> {
        try {
          IterReader iters(cfg, context);
          const ScheduleSpan span = iters.span(type, param);
          const Config min_value = cfg.child("min_value");
          PlateauOptions options;
          options.monitor(cfg.get<std::string>("monitor", "loss"))
              .rule(cfg.get<std::string>("rule", "less"))
              .factor(cfg.get<double>("factor", 0.1))
              .patience(cfg.get<int64_t>("patience", 10))
              .threshold(cfg.get<double>("threshold", 1e-4))
              .threshold_rule(cfg.get<std::string>("threshold_rule", "rel"))
              .cooldown(cfg.get<int64_t>("cooldown", 0))
              .min_value(min_value.is_null() ? std::vector<double>{0.0} : number_or_list(min_value))
              .eps(cfg.get<double>("eps", 1e-8));
          return std::make_shared<ReduceOnPlateauScheduler>(optimizer, options, span, context);
        } catch (const OptionError& error) {
          LOCKSTEP_FAIL(cfg.where(error.key()), ": ", type, ": ", error.what());
        }
      });
    }
    return r;
  }();
  return *registry;
}

}  // namespace lockstep
