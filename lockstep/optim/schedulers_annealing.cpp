#include "lockstep/optim/schedulers_annealing.h"

#include <array>
#include <cmath>

namespace lockstep {
namespace {

const double kPi = std::acos(-1.0);

void check_non_negative(const std::optional<double>& value, const char* key) {
  if (value) {
    check_option(std::isfinite(*value) && *value >= 0, key, key, " must be non-negative, got ", *value);
  }
}

// eta_min and eta_min_ratio: an absolute floor or one relative to the initial value.
// mmengine's CosineAnnealing defaults to eta_min 0; CosineRestart wants one given.
class Floor {
 public:
  enum class Rule { kAtMostOne, kExactlyOne };
  Floor(const std::optional<double>& eta_min, const std::optional<double>& ratio, Rule rule)
      : eta_min_(eta_min.value_or(0.0)), ratio_(ratio) {
    check_option(!(eta_min && ratio), "eta_min_ratio", "set either eta_min or eta_min_ratio, not both");
    check_option(rule == Rule::kAtMostOne || eta_min || ratio, "eta_min",
                 "set one of eta_min and eta_min_ratio");
    check_non_negative(eta_min, "eta_min");
    check_non_negative(ratio, "eta_min_ratio");
  }
  double at(double base) const { return ratio_ ? base * *ratio_ : eta_min_; }
  void describe(nlohmann::json& options) const {
    options["eta_min"] = ratio_ ? nlohmann::json(nullptr) : nlohmann::json(eta_min_);
    options["eta_min_ratio"] = ratio_ ? nlohmann::json(*ratio_) : nlohmann::json(nullptr);
  }

 private:
  double eta_min_;
  std::optional<double> ratio_;
};

// The chainable half-cosine step from k - 1 to k over `period` steps.
double cosine_step(int64_t k, double period, double current, double floor) {
  return (1 + std::cos(kPi * static_cast<double>(k) / period)) /
             (1 + std::cos(kPi * static_cast<double>(k - 1) / period)) * (current - floor) +
         floor;
}

class CosineAnnealingRule : public ScheduleRule {
 public:
  explicit CosineAnnealingRule(const CosineAnnealingOptions& options)
      : t_max_option_(options.T_max()), floor_(options.eta_min(), options.eta_min_ratio(), Floor::Rule::kAtMostOne) {}
  std::string name() const override { return "CosineAnnealing"; }
  nlohmann::json options() const override {
    nlohmann::json options = {{"T_max", t_max_}};
    floor_.describe(options);
    return options;
  }
  void prepare(const ScheduleSpan& span, std::vector<double>&) override {
    t_max_ = t_max_option_.value_or(span.end() - span.begin());
    check_option(t_max_ > 0, "T_max", "T_max must be positive, got ", t_max_);
  }
  double value(int64_t step, size_t, double current, double base) const override {
    if (step == 0) return current;
    const double floor = floor_.at(base);
    // Where cos(pi * (k - 1) / T) = -1 the ratio form divides by zero; mmengine
    // adds the half-period increment instead.
    if ((step - 1 - t_max_) % (2 * t_max_) == 0) {
      return current + (base - floor) * (1 - std::cos(kPi / static_cast<double>(t_max_))) / 2;
    }
    return cosine_step(step, static_cast<double>(t_max_), current, floor);
  }

 private:
  std::optional<int64_t> t_max_option_;
  int64_t t_max_ = 0;
  Floor floor_;
};

class PolyRule : public ScheduleRule {
 public:
  explicit PolyRule(const PolyOptions& options) : eta_min_(options.eta_min()), power_(options.power()) {
    check_non_negative(eta_min_, "eta_min");
    check_option(std::isfinite(power_) && power_ > 0, "power", "power must be positive, got ", power_);
  }
  std::string name() const override { return "Poly"; }
  nlohmann::json options() const override { return {{"eta_min", eta_min_}, {"power", power_}}; }
  void prepare(const ScheduleSpan& span, std::vector<double>&) override {
    total_ = span.end() - span.begin() - 1;
  }
  double value(int64_t step, size_t, double current, double) const override {
    if (step == 0) return current;
    return (current - eta_min_) *
               std::pow(1.0 - 1.0 / static_cast<double>(total_ - step + 1), power_) +
           eta_min_;
  }

 private:
  double eta_min_;
  double power_;
  int64_t total_ = 0;
};

class OneCycleRule : public ScheduleRule {
 public:
  explicit OneCycleRule(const OneCycleOptions& options) : options_(options) {
    check_option(!options_.eta_max().empty(), "eta_max", "eta_max must not be empty");
    for (double peak : options_.eta_max()) {
      check_option(std::isfinite(peak) && peak > 0, "eta_max", "eta_max must be positive, got ", peak);
    }
    const double pct = options_.pct_start();
    check_option(pct >= 0 && pct <= 1, "pct_start", "pct_start must be in [0, 1], got ", pct);
    check_option(options_.anneal_strategy() == "cos" || options_.anneal_strategy() == "linear",
                 "anneal_strategy", "anneal_strategy must be 'cos' or 'linear', got '",
                 options_.anneal_strategy(), "'");
    check_option(options_.div_factor() > 0, "div_factor", "div_factor must be positive, got ",
                 options_.div_factor());
    check_option(options_.final_div_factor() > 0, "final_div_factor",
                 "final_div_factor must be positive, got ", options_.final_div_factor());
  }
  std::string name() const override { return "OneCycle"; }
  nlohmann::json options() const override {
    return {{"eta_max", options_.eta_max()},          {"total_steps", total_},
            {"pct_start", options_.pct_start()},      {"anneal_strategy", options_.anneal_strategy()},
            {"div_factor", options_.div_factor()},    {"final_div_factor", options_.final_div_factor()},
            {"three_phase", options_.three_phase()}};
  }

  void prepare(const ScheduleSpan& span, std::vector<double>& initial) override {
    check_option(span.param() == "lr", "param", "OneCycle schedules lr only, got param '",
                 span.param(), "'");
    total_ = options_.total_steps().value_or(span.end() - span.begin());
    check_option(total_ > 0, "total_steps", "total_steps must be positive, got ", total_);
    // Past total_steps the cycle is undefined; an unbounded range fails at that step instead.
    check_option(span.end() == kUnboundedStep || span.end() - span.begin() - 1 <= total_, "total_steps", "total_steps (", total_,
                 ") is shorter than the scheduler's range [", span.begin(), ", ", span.end(), ")");
    const auto& peaks = options_.eta_max();
    check_option(peaks.size() == 1 || peaks.size() == initial.size(), "eta_max", "eta_max has ",
                 peaks.size(), " values but the optimizer has ", initial.size(), " param groups");
    const double warm_end = options_.pct_start() * static_cast<double>(total_) - 1;
    if (options_.three_phase()) {
      phases_ = {{warm_end, kInitial, kMax}, {2 * warm_end, kMax, kInitial},
                 {static_cast<double>(total_ - 1), kInitial, kMin}};
    } else {
      phases_ = {{warm_end, kInitial, kMax}, {static_cast<double>(total_ - 1), kMax, kMin}};
    }
    double start = 0;
    for (const Phase& phase : phases_) {
      check_option(phase.end_step > start, "pct_start", "pct_start ", options_.pct_start(),
                   " with total_steps ", total_, " leaves a phase of the cycle without steps");
      start = phase.end_step;
    }
    levels_.clear();
    for (size_t g = 0; g < initial.size(); ++g) {
      const double peak = peaks.size() == 1 ? peaks[0] : peaks[g];
      const double first = peak / options_.div_factor();
      levels_.push_back({first, peak, first / options_.final_div_factor()});
      initial[g] = first;  // mmengine sets the group's initial_lr to eta_max / div_factor
    }
  }

  double value(int64_t step, size_t group, double, double) const override {
    LOCKSTEP_CHECK(step <= total_, "OneCycleLR: tried to step ", step + 1,
                   " times; total_steps is ", total_);
    double start = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (static_cast<double>(step) <= phase.end_step || i + 1 == phases_.size()) {
        const double pct = (static_cast<double>(step) - start) / (phase.end_step - start);
        return anneal(levels_[group][phase.from], levels_[group][phase.to], pct);
      }
      start = phase.end_step;
    }
    return 0;  // unreachable: the last phase always answers
  }

 private:
  enum Level { kInitial = 0, kMax = 1, kMin = 2 };
  struct Phase {
    double end_step;
    Level from;
    Level to;
  };
  double anneal(double from, double to, double pct) const {
    if (options_.anneal_strategy() == "cos") return to + (from - to) / 2.0 * (std::cos(kPi * pct) + 1);
    return (to - from) * pct + from;
  }

  OneCycleOptions options_;
  int64_t total_ = 0;
  std::vector<Phase> phases_;
  std::vector<std::array<double, 3>> levels_;  // per group: initial, max, min
};

class CosineRestartRule : public ScheduleRule {
 public:
  explicit CosineRestartRule(const CosineRestartOptions& options)
      : periods_(options.periods()),
        weights_(options.restart_weights()),
        floor_(options.eta_min(), options.eta_min_ratio(), Floor::Rule::kExactlyOne) {
    check_option(!periods_.empty(), "periods", "periods must not be empty");
    for (int64_t period : periods_) {
      check_option(period > 0, "periods", "periods must be positive, got ", period);
    }
    check_option(weights_.size() == periods_.size(), "restart_weights", "restart_weights has ",
                 weights_.size(), " values but periods has ", periods_.size());
    for (double weight : weights_) {
      check_option(std::isfinite(weight) && weight >= 0, "restart_weights",
                   "restart_weights must be non-negative, got ", weight);
    }
  }
  std::string name() const override { return "CosineRestart"; }
  nlohmann::json options() const override {
    nlohmann::json options = {{"periods", periods_}, {"restart_weights", weights_}};
    floor_.describe(options);
    return options;
  }
  double value(int64_t step, size_t, double current, double base) const override {
    int64_t period_start = 0;
    for (size_t j = 0; j < periods_.size(); ++j) {
      if (step < period_start + periods_[j]) {
        const int64_t s = step - period_start;
        if (s == 0) return base * weights_[j];
        return cosine_step(s, static_cast<double>(periods_[j]), current, floor_.at(base));
      }
      period_start += periods_[j];
    }
    return current;
  }

 private:
  std::vector<int64_t> periods_;
  std::vector<double> weights_;
  Floor floor_;
};

}  // namespace

std::unique_ptr<ScheduleRule> make_rule(const CosineAnnealingOptions& options) {
  return std::make_unique<CosineAnnealingRule>(options);
}
std::unique_ptr<ScheduleRule> make_rule(const PolyOptions& options) {
  return std::make_unique<PolyRule>(options);
}
std::unique_ptr<ScheduleRule> make_rule(const OneCycleOptions& options) {
  return std::make_unique<OneCycleRule>(options);
}
std::unique_ptr<ScheduleRule> make_rule(const CosineRestartOptions& options) {
  return std::make_unique<CosineRestartRule>(options);
}

}  // namespace lockstep
