#include "lockstep/optim/schedulers_multiplicative.h"

#include <algorithm>
#include <cmath>

namespace lockstep {
namespace {

void check_positive(double value, const char* key) {
  check_option(std::isfinite(value) && value > 0, key, key, " must be positive, got ", value);
}

class ConstantRule : public ScheduleRule {
 public:
  explicit ConstantRule(const ConstantOptions& options) : factor_(options.factor()) {
    check_option(std::isfinite(factor_) && factor_ > 0 && factor_ <= 1, "factor",
                 "factor must be in (0, 1], got ", factor_);
  }
  std::string name() const override { return "Constant"; }
  nlohmann::json options() const override { return {{"factor", factor_}}; }
  void prepare(const ScheduleSpan& span, std::vector<double>&) override {
    last_ = span.end() - span.begin() - 1;
  }
  double value(int64_t step, size_t, double current, double) const override {
    if (step == 0) return current * factor_;
    if (step != last_) return current;
    return current * (1.0 / factor_);
  }

 private:
  double factor_;
  int64_t last_ = 0;
};

class LinearRule : public ScheduleRule {
 public:
  explicit LinearRule(const LinearOptions& options)
      : start_(options.start_factor()), end_(options.end_factor()) {
    check_option(std::isfinite(start_) && start_ > 0 && start_ <= 1, "start_factor",
                 "start_factor must be in (0, 1], got ", start_);
    check_option(std::isfinite(end_) && end_ >= 0 && end_ <= 1, "end_factor",
                 "end_factor must be in [0, 1], got ", end_);
  }
  std::string name() const override { return "Linear"; }
  nlohmann::json options() const override {
    return {{"start_factor", start_}, {"end_factor", end_}};
  }
  void prepare(const ScheduleSpan& span, std::vector<double>&) override {
    total_ = span.end() - span.begin() - 1;
  }
  double value(int64_t step, size_t, double current, double) const override {
    if (step == 0) return current * start_;
    // The ratio of consecutive factors start + (end - start) * k / total.
    return current * (1.0 + (end_ - start_) /
                                 (static_cast<double>(total_) * start_ +
                                  static_cast<double>(step - 1) * (end_ - start_)));
  }

 private:
  double start_;
  double end_;
  int64_t total_ = 0;
};

class StepRule : public ScheduleRule {
 public:
  explicit StepRule(const StepOptions& options)
      : step_size_(options.step_size()), gamma_(options.gamma()) {
    check_option(step_size_ > 0, "step_size", "step_size must be positive, got ", step_size_);
    check_positive(gamma_, "gamma");
  }
  std::string name() const override { return "Step"; }
  nlohmann::json options() const override { return {{"step_size", step_size_}, {"gamma", gamma_}}; }
  double value(int64_t step, size_t, double current, double) const override {
    if (step == 0 || step % step_size_ != 0) return current;
    return current * gamma_;
  }

 private:
  int64_t step_size_;
  double gamma_;
};

class MultiStepRule : public ScheduleRule {
 public:
  explicit MultiStepRule(const MultiStepOptions& options)
      : milestones_(options.milestones()), gamma_(options.gamma()) {
    check_option(!milestones_.empty(), "milestones", "milestones must not be empty");
    for (size_t i = 0; i < milestones_.size(); ++i) {
      check_option(milestones_[i] >= 0, "milestones", "milestones must be non-negative, got ",
                   milestones_[i]);
    }
    // From the second on: the message's arguments are evaluated whatever the
    // condition, so milestones_[i - 1] must exist (GCC 16's libstdc++ asserts
    // it at -O0; at -O2 the first milestone's check read before the vector).
    for (size_t i = 1; i < milestones_.size(); ++i) {
      check_option(milestones_[i - 1] <= milestones_[i], "milestones", "milestones must be in increasing order, got ",
                   milestones_[i - 1], " before ", milestones_[i]);
    }
    check_positive(gamma_, "gamma");
  }
  std::string name() const override { return "MultiStep"; }
  nlohmann::json options() const override { return {{"milestones", milestones_}, {"gamma", gamma_}}; }
  double value(int64_t step, size_t, double current, double) const override {
    const auto count = std::count(milestones_.begin(), milestones_.end(), step);
    if (count == 0) return current;
    return current * std::pow(gamma_, static_cast<double>(count));
  }

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

class ExponentialRule : public ScheduleRule {
 public:
  explicit ExponentialRule(const ExponentialOptions& options) : gamma_(options.gamma()) {
    check_positive(gamma_, "gamma");
  }
  std::string name() const override { return "Exponential"; }
  nlohmann::json options() const override { return {{"gamma", gamma_}}; }
  double value(int64_t step, size_t, double current, double) const override {
    return step == 0 ? current : current * gamma_;
  }

 private:
  double gamma_;
};

}  // namespace

std::unique_ptr<ScheduleRule> make_rule(const ConstantOptions& options) {
  return std::make_unique<ConstantRule>(options);
}
std::unique_ptr<ScheduleRule> make_rule(const LinearOptions& options) {
  return std::make_unique<LinearRule>(options);
}
std::unique_ptr<ScheduleRule> make_rule(const StepOptions& options) {
  return std::make_unique<StepRule>(options);
}
std::unique_ptr<ScheduleRule> make_rule(const MultiStepOptions& options) {
  return std::make_unique<MultiStepRule>(options);
}
std::unique_ptr<ScheduleRule> make_rule(const ExponentialOptions& options) {
  return std::make_unique<ExponentialRule>(options);
}

}  // namespace lockstep
