#include "lockstep/optim/param_scheduler.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/optim/optimizer_state.h"
#include "lockstep/optim/param_groups.h"
#include "lockstep/optim/schedulers_annealing.h"
#include "lockstep/optim/schedulers_multiplicative.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
namespace optim = torch::optim;

std::vector<torch::Tensor> params() { return {torch::zeros({2}, torch::requires_grad())}; }

void expect_close(double actual, double expected, int64_t iteration) {
  EXPECT_NEAR(actual, expected, 1e-9 * std::max(std::abs(expected), 1e-6)) << "iteration " << iteration;
}

// Linear warm-up factor of [0, end) from `start` to 1, held at 1 afterwards.
double warmup(int64_t i, double start, int64_t end) {
  const double k = double(std::min(i, end - 1));
  return start + (1 - start) * k / double(end - 1);
}

TEST(ParamSchedulerTest, ConstructionAppliesStepZeroOnlyWhenTheRangeStartsAtZero) {
  optim::SGD sgd(params(), optim::SGDOptions(0.1));
  ParamScheduler now(sgd, make_rule(LinearOptions().start_factor(0.5)), ScheduleSpan().end(10));
  EXPECT_EQ(now.last_step(), 0);
  EXPECT_DOUBLE_EQ(get_group_option(sgd, 0, "lr"), 0.05);
  ParamScheduler later(sgd, make_rule(ConstantOptions().factor(0.5)), ScheduleSpan().begin(3).end(10));
  EXPECT_EQ(later.last_step(), -1);
  EXPECT_DOUBLE_EQ(get_group_option(sgd, 0, "lr"), 0.05);
  EXPECT_EQ(later.last_values(), std::vector<double>{get_group_option(sgd, 0, "lr")});
}

TEST(ParamSchedulerTest, WarmupThenCosineIsTheProductOfClosedForms) {
  const int64_t warm = 50, max_iters = 200;
  const double start = 0.001, base = 0.1;
  optim::SGD sgd(params(), optim::SGDOptions(base));
  SchedulerContext context;
  ParamScheduler linear(sgd, make_rule(LinearOptions().start_factor(start)), ScheduleSpan().end(warm), context);
  ParamScheduler cosine(sgd, make_rule(CosineAnnealingOptions()), ScheduleSpan().begin(warm).end(max_iters),
                        context);
  for (int64_t i = 0; i < max_iters + 5; ++i) {
    if (i > 0) {
      linear.step();
      cosine.step();
    }
    const double k = double(std::clamp<int64_t>(i, warm, max_iters - 1) - warm);
    const double cosine_factor = (1 + std::cos(M_PI * k / double(max_iters - warm))) / 2;
    expect_close(get_group_option(sgd, 0, "lr"), base * warmup(i, start, warm) * cosine_factor, i);
  }
}

TEST(ParamSchedulerTest, OverlappingSchedulersComposeMultiplicatively) {
  const double base = 0.2;
  optim::SGD sgd(params(), optim::SGDOptions(base));
  SchedulerContext context;
  ParamScheduler linear(sgd, make_rule(LinearOptions().start_factor(0.1)), ScheduleSpan().end(20), context);
  ParamScheduler decay(sgd, make_rule(ExponentialOptions(0.95)), ScheduleSpan(), context);
  ParamScheduler steps(sgd, make_rule(StepOptions(7).gamma(0.5)), ScheduleSpan().begin(3), context);
  for (int64_t i = 0; i < 40; ++i) {
    if (i > 0) {
      linear.step();
      decay.step();
      steps.step();
    }
    const double step_factor = i < 3 ? 1.0 : std::pow(0.5, double((i - 3) / 7));
    expect_close(get_group_option(sgd, 0, "lr"), base * warmup(i, 0.1, 20) * std::pow(0.95, i) * step_factor, i);
  }
}

TEST(ParamSchedulerTest, EtaMinRatioIsRelativeToTheLrBeforeAnySchedulerNotTheWarmedUpOne) {
  // mmengine records initial_lr once per param group: the cosine built after
  // the warm-up (which already scaled lr by 0.01) still sees base 0.1.
  const double base = 0.1, ratio = 0.1;
  optim::SGD sgd(params(), optim::SGDOptions(base));
  SchedulerContext context;
  ParamScheduler linear(sgd, make_rule(LinearOptions().start_factor(0.01)), ScheduleSpan().end(10), context);
  ParamScheduler cosine(sgd, make_rule(CosineAnnealingOptions().eta_min_ratio(ratio)),
                        ScheduleSpan().begin(10).end(30), context);
  for (int64_t i = 1; i < 30; ++i) {
    linear.step();
    cosine.step();
  }
  const double k = 19, floor = base * ratio;
  expect_close(get_group_option(sgd, 0, "lr"), floor + (base - floor) * (1 + std::cos(M_PI * k / 20)) / 2, 29);
}

TEST(ParamSchedulerTest, OneCycleSetsTheInitialValueLaterSchedulersSee) {
  optim::SGD sgd(params(), optim::SGDOptions(0.1));
  SchedulerContext context;
  ParamScheduler cycle(sgd, make_rule(OneCycleOptions({2.0}).total_steps(10).div_factor(4)),
                       ScheduleSpan().end(10), context);
  EXPECT_DOUBLE_EQ(get_group_option(sgd, 0, "lr"), 0.5);
  // After the cycle, a restart schedule peaks at the recorded initial value 2.0 / 4.
  ParamScheduler restart(sgd, make_rule(CosineRestartOptions({4}).eta_min(0.0)),
                         ScheduleSpan().begin(10).end(14), context);
  for (int i = 1; i <= 10; ++i) {
    cycle.step();
    restart.step();
  }
  EXPECT_DOUBLE_EQ(get_group_option(sgd, 0, "lr"), 0.5);
}

TEST(ParamSchedulerTest, MomentumOfSgdFollowsItsScheduleAndLeavesLrAlone) {
  optim::SGD sgd(params(), optim::SGDOptions(0.1).momentum(0.9));
  ParamScheduler scheduler(sgd, make_rule(CosineAnnealingOptions().T_max(10).eta_min(0.85)),
                           ScheduleSpan().param("momentum").end(10));
  EXPECT_EQ(scheduler.name(), "CosineAnnealingMomentum");
  for (int64_t i = 0; i < 12; ++i) {
    if (i > 0) scheduler.step();
    const double k = double(std::min<int64_t>(i, 9));
    expect_close(get_group_option(sgd, 0, "momentum"), 0.85 + 0.05 * (1 + std::cos(M_PI * k / 10)) / 2, i);
    EXPECT_EQ(get_group_option(sgd, 0, "lr"), 0.1);
  }
}

TEST(ParamSchedulerTest, MomentumOfAdamIsBeta1AndBeta2IsUntouched) {
  optim::Adam adam(params(), optim::AdamOptions(1e-3).betas({0.9, 0.999}));
  ParamScheduler scheduler(adam, make_rule(LinearOptions().start_factor(0.5)),
                           ScheduleSpan().param("momentum").end(6));
  for (int64_t i = 0; i < 8; ++i) {
    if (i > 0) scheduler.step();
    const auto& betas = static_cast<const optim::AdamOptions&>(adam.param_groups()[0].options()).betas();
    expect_close(std::get<0>(betas), 0.9 * warmup(i, 0.5, 6), i);
    EXPECT_EQ(std::get<1>(betas), 0.999);
  }
}

TEST(ParamSchedulerTest, BadSpansAndParamsAreOptionErrors) {
  optim::SGD sgd(params(), optim::SGDOptions(0.1));
  try {
    ParamScheduler(sgd, make_rule(ExponentialOptions(0.9)), ScheduleSpan().begin(5).end(5));
    FAIL() << "no error";
  } catch (const OptionError& error) {
    EXPECT_EQ(error.key(), "end");
    EXPECT_THAT(error.what(), HasSubstr("end (5) must be larger than begin (5)"));
  }
  optim::Adagrad adagrad(params(), optim::AdagradOptions(0.1));
  EXPECT_THAT([&] { ParamScheduler(adagrad, make_rule(ExponentialOptions(0.9)), ScheduleSpan().param("momentum")); },
              ::testing::ThrowsMessage<OptionError>(HasSubstr("Adagrad has no option 'momentum' to schedule")));
  EXPECT_THAT([&] { ParamScheduler(sgd, make_rule(OneCycleOptions({1.0})), ScheduleSpan().param("momentum").end(9)); },
              ::testing::ThrowsMessage<OptionError>(HasSubstr("OneCycle schedules lr only")));
}

TEST(ParamSchedulerTest, RuleOptionsAreValidated) {
  auto key_of = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const OptionError& error) {
      return error.key() + ": " + error.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(key_of([] { make_rule(ExponentialOptions(-0.5)); }), "gamma: gamma must be positive, got -0.5");
  EXPECT_EQ(key_of([] { make_rule(StepOptions(0)); }), "step_size: step_size must be positive, got 0");
  EXPECT_EQ(key_of([] { make_rule(MultiStepOptions({})); }), "milestones: milestones must not be empty");
  EXPECT_EQ(key_of([] { make_rule(MultiStepOptions({5, 3})); }),
            "milestones: milestones must be in increasing order, got 5 before 3");
  EXPECT_EQ(key_of([] { make_rule(LinearOptions().start_factor(0)); }),
            "start_factor: start_factor must be in (0, 1], got 0");
  EXPECT_EQ(key_of([] { make_rule(ConstantOptions().factor(1.5)); }), "factor: factor must be in (0, 1], got 1.5");
  EXPECT_EQ(key_of([] { make_rule(CosineAnnealingOptions().eta_min(0.1).eta_min_ratio(0.1)); }),
            "eta_min_ratio: set either eta_min or eta_min_ratio, not both");
  EXPECT_EQ(key_of([] { make_rule(CosineRestartOptions({5, 5})); }), "eta_min: set one of eta_min and eta_min_ratio");
  EXPECT_EQ(key_of([] { make_rule(CosineRestartOptions({5, 5}).eta_min(0.0)); }),
            "restart_weights: restart_weights has 1 values but periods has 2");
  EXPECT_EQ(key_of([] { make_rule(OneCycleOptions({1.0}).anneal_strategy("cosine")); }),
            "anneal_strategy: anneal_strategy must be 'cos' or 'linear', got 'cosine'");
  EXPECT_EQ(key_of([] { make_rule(PolyOptions().power(0)); }), "power: power must be positive, got 0");

  optim::SGD sgd(params(), optim::SGDOptions(0.1));
  EXPECT_EQ(key_of([&] { ParamScheduler(sgd, make_rule(CosineAnnealingOptions().T_max(0)), ScheduleSpan()); }),
            "T_max: T_max must be positive, got 0");
  EXPECT_EQ(key_of([&] { ParamScheduler(sgd, make_rule(OneCycleOptions({1.0}).total_steps(5)), ScheduleSpan().end(10)); }),
            "total_steps: total_steps (5) is shorter than the scheduler's range [0, 10)");
  EXPECT_EQ(key_of([&] { ParamScheduler(sgd, make_rule(OneCycleOptions({1.0}).pct_start(0.1)), ScheduleSpan().end(10)); }),
            "pct_start: pct_start 0.1 with total_steps 10 leaves a phase of the cycle without steps");
}

TEST(ParamSchedulerTest, OneCyclePastTotalStepsIsAnError) {
  optim::SGD sgd(params(), optim::SGDOptions(0.1));
  ParamScheduler cycle(sgd, make_rule(OneCycleOptions({1.0}).total_steps(10)), ScheduleSpan());
  for (int i = 1; i <= 10; ++i) cycle.step();  // step 10 == total_steps is still allowed (mmengine)
  EXPECT_THAT([&] { cycle.step(); }, ::testing::ThrowsMessage<Error>(HasSubstr("tried to step 12 times; total_steps is 10")));
}

// A warm-up + cosine run over SGD with momentum (so optimizer state matters too).
struct TrainingRun {
  std::vector<torch::Tensor> weights = {torch::ones({3}, torch::requires_grad())};
  optim::SGD sgd{weights, optim::SGDOptions(0.1).momentum(0.9)};
  SchedulerContext context;
  ParamScheduler linear{sgd, make_rule(LinearOptions().start_factor(0.01)), ScheduleSpan().end(20), context};
  ParamScheduler cosine{sgd, make_rule(CosineAnnealingOptions().eta_min_ratio(0.01)),
                        ScheduleSpan().begin(20).end(100), context};
  void iterate() {
    sgd.zero_grad();
    (weights[0] * weights[0]).sum().backward();
    sgd.step();
    linear.step();
    cosine.step();
  }
};

TEST(ParamSchedulerTest, ResumeMidScheduleGivesTheUninterruptedValues) {
  for (int stop : {5, 20, 57}) {
    TrainingRun uninterrupted;
    TrainingRun first;
    std::vector<double> expected;
    for (int i = 0; i < 100; ++i) {
      uninterrupted.iterate();
      expected.push_back(get_group_option(uninterrupted.sgd, 0, "lr"));
    }
    for (int i = 0; i < stop; ++i) first.iterate();
    State optimizer_state = save_optimizer_state(first.sgd);
    State linear_state = first.linear.state();
    State cosine_state = first.cosine.state();

    TrainingRun resumed;  // a new process: build from config, then load optimizer, then schedulers
    resumed.weights[0].detach().copy_(first.weights[0].detach());
    load_optimizer_state(resumed.sgd, optimizer_state);
    resumed.linear.load_state(linear_state);
    resumed.cosine.load_state(cosine_state);
    EXPECT_EQ(resumed.cosine.last_step(), first.cosine.last_step());
    EXPECT_EQ(resumed.linear.last_values(), first.linear.last_values());
    for (int i = stop; i < 100; ++i) {
      resumed.iterate();
      EXPECT_EQ(get_group_option(resumed.sgd, 0, "lr"), expected[i]) << "stop " << stop << " iteration " << i;
    }
    EXPECT_TRUE(torch::equal(resumed.weights[0], uninterrupted.weights[0])) << "stop " << stop;
  }
}

TEST(ParamSchedulerTest, LoadStateRefusesADifferentSchedule) {
  optim::SGD sgd(params(), optim::SGDOptions(0.1));
  ParamScheduler saved(sgd, make_rule(CosineAnnealingOptions().T_max(10)), ScheduleSpan().end(50));
  ParamScheduler other(sgd, make_rule(CosineAnnealingOptions().T_max(20)), ScheduleSpan().end(50));
  EXPECT_THAT([&] { other.load_state(saved.state()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("CosineAnnealingLR: the checkpoint's schedule")));
  ParamScheduler momentum(sgd, make_rule(ExponentialOptions(0.5)), ScheduleSpan().param("weight_decay"));
  EXPECT_EQ(momentum.name(), "Exponential(weight_decay)");
  EXPECT_THAT([&] { momentum.load_state(State()); }, ::testing::ThrowsMessage<Error>(HasSubstr("lacks schedule")));
}

}  // namespace
}  // namespace lockstep
