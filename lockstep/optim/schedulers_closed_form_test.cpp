// Every schedule against its closed form, written here independently of the
// chainable (recursive) formulas the library uses, at every iteration of a run
// that covers the iterations before `begin`, at it, at `end - 1` and after.
#include <cmath>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/optim/param_groups.h"
#include "lockstep/optim/param_scheduler.h"
#include "lockstep/optim/schedulers_annealing.h"
#include "lockstep/optim/schedulers_multiplicative.h"

namespace lockstep {
namespace {

namespace optim = torch::optim;
const std::vector<double> kBaseLr = {0.1, 0.02};

// SGD with two groups: lr 0.1 / 0.02, momentum 0.9 / 0.8.
std::unique_ptr<optim::SGD> make_sgd() {
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({2}, torch::requires_grad())},
                      std::make_unique<optim::SGDOptions>(optim::SGDOptions(0.1).momentum(0.9)));
  groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({3}, torch::requires_grad())},
                      std::make_unique<optim::SGDOptions>(optim::SGDOptions(0.02).momentum(0.8)));
  return std::make_unique<optim::SGD>(groups, optim::SGDOptions(0.5));
}

void expect_close(double actual, double expected, const std::string& where) {
  const double tolerance = 1e-9 * std::max(std::abs(expected), 1e-6);
  EXPECT_NEAR(actual, expected, tolerance) << where;
}

// The value each group uses in iterations 0..iterations-1: iteration 0 runs
// with what construction left, iteration i after i further step() calls.
using ClosedForm = std::function<double(int64_t iteration, double base)>;
void expect_schedule(std::unique_ptr<ScheduleRule> rule, const ScheduleSpan& span, int64_t iterations,
                     const ClosedForm& closed_form) {
  auto optimizer = make_sgd();
  ParamScheduler scheduler(*optimizer, std::move(rule), span);
  for (int64_t i = 0; i < iterations; ++i) {
    if (i > 0) scheduler.step();
    for (size_t g = 0; g < kBaseLr.size(); ++g) {
      const double expected = closed_form(i, kBaseLr[g]);
      expect_close(get_group_option(*optimizer, g, "lr"), expected,
                   scheduler.name() + " iteration " + std::to_string(i) + " group " + std::to_string(g));
      EXPECT_EQ(scheduler.last_values()[g], get_group_option(*optimizer, g, "lr"));
    }
  }
}

TEST(SchedulerClosedFormTest, Linear) {
  const int64_t begin = 3, end = 13, n = end - begin - 1;
  const double start = 0.25, stop = 0.9;
  expect_schedule(make_rule(LinearOptions().start_factor(start).end_factor(stop)),
                  ScheduleSpan().begin(begin).end(end), 20, [&](int64_t i, double base) {
                    if (i < begin) return base;
                    const int64_t k = std::min(i - begin, n);
                    return base * (start + (stop - start) * double(k) / double(n));
                  });
}

TEST(SchedulerClosedFormTest, ConstantIsUndoneOnTheLastStepOfItsRange) {
  const int64_t begin = 2, end = 8;
  expect_schedule(make_rule(ConstantOptions().factor(0.5)), ScheduleSpan().begin(begin).end(end), 12,
                  [&](int64_t i, double base) { return (i >= begin && i < end - 1) ? base * 0.5 : base; });
}

TEST(SchedulerClosedFormTest, Step) {
  const int64_t begin = 1, end = 12;
  expect_schedule(make_rule(StepOptions(3).gamma(0.5)), ScheduleSpan().begin(begin).end(end), 18,
                  [&](int64_t i, double base) {
                    if (i < begin) return base;
                    const int64_t k = std::min(i, end - 1) - begin;
                    return base * std::pow(0.5, double(k / 3));
                  });
}

TEST(SchedulerClosedFormTest, MultiStepCountsRepeatedMilestonesTwice) {
  const std::vector<int64_t> milestones = {2, 5, 5, 9};
  expect_schedule(make_rule(MultiStepOptions(milestones).gamma(0.1)), ScheduleSpan(), 14,
                  [&](int64_t i, double base) {
                    int passed = 0;
                    for (int64_t m : milestones) passed += m <= i;
                    return base * std::pow(0.1, passed);
                  });
}

TEST(SchedulerClosedFormTest, Exponential) {
  const int64_t begin = 4, end = 10;
  expect_schedule(make_rule(ExponentialOptions(0.9)), ScheduleSpan().begin(begin).end(end), 15,
                  [&](int64_t i, double base) {
                    if (i < begin) return base;
                    return base * std::pow(0.9, double(std::min(i, end - 1) - begin));
                  });
}

TEST(SchedulerClosedFormTest, CosineAnnealingIsPeriodicPastTMax) {
  // 23 steps with T_max 6 cross the half-period corrections at k = 7 and 19.
  const int64_t begin = 2, end = 25, t_max = 6;
  const double eta_min = 0.001;
  expect_schedule(make_rule(CosineAnnealingOptions().T_max(t_max).eta_min(eta_min)),
                  ScheduleSpan().begin(begin).end(end), 30, [&](int64_t i, double base) {
                    if (i < begin) return base;
                    const double k = double(std::min(i, end - 1) - begin);
                    return eta_min + (base - eta_min) * (1 + std::cos(M_PI * k / t_max)) / 2;
                  });
}

TEST(SchedulerClosedFormTest, CosineAnnealingDefaultsTMaxToTheRangeAndTakesARatio) {
  const int64_t end = 16;
  expect_schedule(make_rule(CosineAnnealingOptions().eta_min_ratio(0.05)), ScheduleSpan().end(end), 20,
                  [&](int64_t i, double base) {
                    const double floor = 0.05 * base;
                    const double k = double(std::min(i, end - 1));
                    return floor + (base - floor) * (1 + std::cos(M_PI * k / end)) / 2;
                  });
}

TEST(SchedulerClosedFormTest, PolyReachesEtaMinOnTheLastStep) {
  const int64_t end = 11, n = end - 1;
  const double eta_min = 0.001;
  expect_schedule(make_rule(PolyOptions().eta_min(eta_min).power(2.0)), ScheduleSpan().end(end), 15,
                  [&](int64_t i, double base) {
                    const double k = double(std::min(i, n));
                    return eta_min + (base - eta_min) * std::pow(1 - k / n, 2.0);
                  });
}

// Interpolation between `from` and `to` at fraction t, cosine-shaped or linear.
double cos_between(double from, double to, double t) { return from + (to - from) * (1 - std::cos(M_PI * t)) / 2; }
double linear_between(double from, double to, double t) { return from * (1 - t) + to * t; }

TEST(SchedulerClosedFormTest, OneCycleTwoPhasesCosine) {
  const double peak = 1.0, low = peak / 25, floor = low / 1e4;
  // pct_start 0.25 of 20 steps: the peak is reached at step 4, the floor at 19.
  expect_schedule(make_rule(OneCycleOptions({peak}).total_steps(20).pct_start(0.25)), ScheduleSpan().end(20),
                  20, [&](int64_t i, double) {
                    if (i <= 4) return cos_between(low, peak, i / 4.0);
                    return cos_between(peak, floor, (i - 4) / 15.0);
                  });
}

TEST(SchedulerClosedFormTest, OneCycleThreePhasesLinearWithOnePeakPerGroup) {
  auto optimizer = make_sgd();
  ParamScheduler scheduler(*optimizer,
                           make_rule(OneCycleOptions({1.0, 0.5})
                                         .total_steps(20)
                                         .pct_start(0.25)
                                         .anneal_strategy("linear")
                                         .three_phase(true)
                                         .div_factor(10)
                                         .final_div_factor(100)),
                           ScheduleSpan().end(20));
  for (int64_t i = 0; i < 20; ++i) {
    if (i > 0) scheduler.step();
    for (size_t g = 0; g < 2; ++g) {
      const double peak = g == 0 ? 1.0 : 0.5, low = peak / 10, floor = low / 100;
      double expected;
      if (i <= 4) {
        expected = linear_between(low, peak, i / 4.0);
      } else if (i <= 8) {
        expected = linear_between(peak, low, (i - 4) / 4.0);
      } else {
        expected = linear_between(low, floor, (i - 8) / 11.0);
      }
      expect_close(get_group_option(*optimizer, g, "lr"), expected, "iteration " + std::to_string(i));
    }
  }
  EXPECT_DOUBLE_EQ(get_group_option(*optimizer, 1, "lr"), 0.0005);
}

TEST(SchedulerClosedFormTest, CosineRestartRestartsFromWeightedPeaksAndHoldsAfterTheLastPeriod) {
  const std::vector<int64_t> periods = {5, 10};
  const std::vector<double> weights = {1.0, 0.5};
  const double eta_min = 0.001;
  expect_schedule(make_rule(CosineRestartOptions(periods).restart_weights(weights).eta_min(eta_min)),
                  ScheduleSpan(), 20, [&](int64_t i, double base) {
                    const int64_t k = std::min<int64_t>(i, 14);  // after 15 steps: held
                    const size_t j = k < 5 ? 0 : 1;
                    const double s = double(k < 5 ? k : k - 5);
                    const double peak = base * weights[j];
                    return eta_min + (peak - eta_min) * (1 + std::cos(M_PI * s / periods[j])) / 2;
                  });
}

}  // namespace
}  // namespace lockstep
