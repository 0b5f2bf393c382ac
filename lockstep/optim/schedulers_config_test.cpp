#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/config/config.h"
#include "lockstep/optim/optimizer_state.h"
#include "lockstep/optim/param_groups.h"
#include "lockstep/optim/param_scheduler.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
namespace optim = torch::optim;

std::vector<torch::Tensor> scheduled_params() { return {torch::zeros({2}, torch::requires_grad())}; }

std::vector<std::shared_ptr<ParamScheduler>> build_all(const std::string& yaml, optim::Optimizer& optimizer,
                                                       const SchedulerContext& context) {
  Config list = parse_config(yaml, "sched.yaml");
  std::vector<std::shared_ptr<ParamScheduler>> schedulers;
  for (size_t i = 0; i < list.size(); ++i) {
    schedulers.push_back(scheduler_registry().build(list.at(i), optimizer, context));
  }
  return schedulers;
}

// The `option` used in each of `iterations` iterations under the schedulers in `yaml`.
std::vector<double> trace(const std::string& yaml, int iterations, int64_t iters_per_epoch = 10,
                          int64_t max_iters = 0, const std::string& option = "lr") {
  optim::SGD sgd(scheduled_params(), optim::SGDOptions(0.1).momentum(0.9));
  SchedulerContext context;
  context.iters_per_epoch = iters_per_epoch;
  context.max_iters = max_iters;
  auto schedulers = build_all(yaml, sgd, context);
  std::vector<double> values;
  for (int i = 0; i < iterations; ++i) {
    if (i > 0) {
      for (auto& s : schedulers) s->step();
    }
    values.push_back(get_group_option(sgd, 0, option));
  }
  return values;
}

std::string scheduler_build_error(const std::string& yaml, int64_t iters_per_epoch = 10) {
  try {
    trace(yaml, 1, iters_per_epoch);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(SchedulersConfigTest, EveryTypeHasItsMomentumTwinExceptOneCycle) {
  const auto names = scheduler_registry().names();
  for (const char* family :
       {"Constant", "Linear", "Step", "MultiStep", "Exponential", "CosineAnnealing", "Poly", "CosineRestart"}) {
    EXPECT_TRUE(scheduler_registry().contains(std::string(family) + "LR")) << family;
    EXPECT_TRUE(scheduler_registry().contains(std::string(family) + "Momentum")) << family;
  }
  EXPECT_TRUE(scheduler_registry().contains("OneCycleLR"));
  EXPECT_FALSE(scheduler_registry().contains("OneCycleMomentum"));
}

TEST(SchedulersConfigTest, ByEpochNumbersAreConvertedWithItersPerEpoch) {
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"[{type: StepLR, step_size: 2, gamma: 0.5, begin: 1, end: 5}]",
       "[{type: StepLR, by_epoch: false, step_size: 20, gamma: 0.5, begin: 10, end: 50}]"},
      {"[{type: MultiStepLR, milestones: [1, 3], gamma: 0.5}]",
       "[{type: MultiStepLR, by_epoch: false, milestones: [10, 30], gamma: 0.5}]"},
      {"[{type: CosineAnnealingLR, T_max: 3, begin: 0.5, end: 6, eta_min: 0.01}]",
       "[{type: CosineAnnealingLR, by_epoch: false, T_max: 30, begin: 5, end: 60, eta_min: 0.01}]"},
      {"[{type: OneCycleLR, eta_max: 1.0, total_steps: 5, end: 5}]",
       "[{type: OneCycleLR, by_epoch: false, eta_max: 1.0, total_steps: 50, end: 50}]"},
      {"[{type: CosineRestartLR, periods: [1, 2], restart_weights: [1, 0.5], eta_min_ratio: 0.1}]",
       "[{type: CosineRestartLR, by_epoch: false, periods: [10, 20], restart_weights: [1, 0.5], eta_min_ratio: 0.1}]"},
      {"[{type: LinearLR, start_factor: 0.1, end: 2}, {type: PolyLR, power: 2, begin: 2, end: 6}]",
       "[{type: LinearLR, start_factor: 0.1, end: 20, by_epoch: false},"
       " {type: PolyLR, power: 2, begin: 20, end: 60, by_epoch: false}]"}};
  for (const auto& [epochs, iterations] : pairs) {
    const auto by_epoch = trace(epochs, 70);
    EXPECT_EQ(by_epoch, trace(iterations, 70)) << epochs;
    EXPECT_NE(by_epoch, trace(epochs, 70, /*iters_per_epoch=*/1)) << epochs;  // the conversion matters
  }
}

TEST(SchedulersConfigTest, EndDefaultsToMaxItersOrUnbounded) {
  optim::SGD sgd(scheduled_params(), optim::SGDOptions(0.1));
  SchedulerContext context;
  context.max_iters = 120;
  auto bounded = build_all("[{type: CosineAnnealingLR, by_epoch: false}]", sgd, context);
  EXPECT_EQ(bounded[0]->end(), 120);
  EXPECT_EQ(bounded[0]->rule().options()["T_max"], 120);  // T_max defaults to end - begin
  SchedulerContext no_max;
  auto unbounded = build_all("[{type: ExponentialLR, gamma: 0.9}]", sgd, no_max);
  EXPECT_EQ(unbounded[0]->end(), kUnboundedStep);
}

TEST(SchedulersConfigTest, MomentumTypesAndTheParamKey) {
  EXPECT_EQ(trace("[{type: LinearMomentum, start_factor: 0.5, end: 10, by_epoch: false}]", 12, 10, 0, "momentum"),
            trace("[{type: LinearLR, param: momentum, start_factor: 0.5, end: 10, by_epoch: false}]", 12, 10, 0,
                  "momentum"));
  EXPECT_EQ(trace("[{type: LinearMomentum, start_factor: 0.5, end: 10, by_epoch: false}]", 12)[5], 0.1);

  optim::Adam adam(scheduled_params(), optim::AdamOptions(1e-3).betas({0.95, 0.999}));
  SchedulerContext context;
  auto schedulers = build_all("[{type: CosineAnnealingMomentum, T_max: 4, eta_min: 0.85, by_epoch: false}]", adam,
                              context);
  for (int i = 0; i < 4; ++i) schedulers[0]->step();
  const auto& betas = static_cast<const optim::AdamOptions&>(adam.param_groups()[0].options()).betas();
  EXPECT_DOUBLE_EQ(std::get<0>(betas), 0.85);
  EXPECT_EQ(std::get<1>(betas), 0.999);
  EXPECT_EQ(get_group_option(adam, 0, "lr"), 1e-3);
}

TEST(SchedulersConfigTest, BadValuesNameTheKeyAndLine) {
  EXPECT_THAT(scheduler_build_error("[{type: ExponentialLR, gamma: -0.1}]"),
              HasSubstr("sched.yaml:1 (key 0.gamma): ExponentialLR: gamma must be positive, got -0.1"));
  EXPECT_THAT(scheduler_build_error("- type: StepLR\n  step_size: 1\n  begin: 3\n  end: 2\n"),
              HasSubstr("sched.yaml:4 (key 0.end): StepLR: end (20) must be larger than begin (30)"));
  EXPECT_THAT(scheduler_build_error("[{type: CosineAnnealingLR, T_max: 0}]"), HasSubstr("T_max must be positive, got 0"));
  EXPECT_THAT(scheduler_build_error("[{type: MultiStepLR, milestones: []}]"), HasSubstr("milestones must not be empty"));
  EXPECT_THAT(scheduler_build_error("[{type: StepLR, step_size: 2, gama: 0.5}]"), HasSubstr("gama"));
  EXPECT_THAT(scheduler_build_error("[{type: LinearMomentum, param: lr}]"),
              HasSubstr("LinearMomentum schedules momentum, so param cannot be 'lr'"));
  EXPECT_THAT(scheduler_build_error("[{type: LinearLR, param: betas}]"), HasSubstr("param must be lr, momentum or weight_decay"));
  EXPECT_THAT(scheduler_build_error("[{type: LinearLR, convert_to_iter_based: false}]"),
              HasSubstr("convert_to_iter_based can only be true"));
  EXPECT_EQ(scheduler_build_error("[{type: LinearLR, convert_to_iter_based: true, end: 3}]"), "(no error)");
  EXPECT_THAT(scheduler_build_error("[{type: LinearLR, end: 3}]", /*iters_per_epoch=*/0),
              HasSubstr("a by_epoch schedule needs the number of iterations per epoch, got 0"));
  EXPECT_THAT(scheduler_build_error("[{type: CosineRestartLR, periods: [2]}]"),
              HasSubstr("set one of eta_min and eta_min_ratio"));
  EXPECT_THAT(scheduler_build_error("[{type: WarmupLR}]"), HasSubstr("unknown param scheduler type 'WarmupLR'"));
}

TEST(SchedulersConfigTest, ResumeFromStateGivesTheUninterruptedSchedule) {
  const std::string yaml =
      "- {type: LinearLR, start_factor: 0.001, by_epoch: false, end: 30}\n"
      "- {type: CosineAnnealingLR, by_epoch: false, begin: 30, eta_min_ratio: 0.01}\n"
      "- {type: CosineAnnealingMomentum, eta_min: 0.5, T_max: 2}\n";
  SchedulerContext context;
  context.iters_per_epoch = 7;
  context.max_iters = 90;
  const auto expected = trace(yaml, 90, 7, 90);
  const auto expected_momentum = trace(yaml, 90, 7, 90, "momentum");

  optim::SGD first(scheduled_params(), optim::SGDOptions(0.1).momentum(0.9));
  auto schedulers = build_all(yaml, first, context);
  for (int i = 1; i <= 41; ++i) {
    for (auto& s : schedulers) s->step();
  }
  State optimizer_state = save_optimizer_state(first);
  std::vector<State> states;
  for (auto& s : schedulers) states.push_back(s->state());

  optim::SGD second(scheduled_params(), optim::SGDOptions(0.1).momentum(0.9));
  SchedulerContext fresh = context;
  fresh.initial_values = std::make_shared<InitialValues>();
  auto resumed = build_all(yaml, second, fresh);
  load_optimizer_state(second, optimizer_state);
  for (size_t k = 0; k < resumed.size(); ++k) resumed[k]->load_state(states[k]);
  for (int i = 42; i < 90; ++i) {
    for (auto& s : resumed) s->step();
    EXPECT_EQ(get_group_option(second, 0, "lr"), expected[i]) << "iteration " << i;
    EXPECT_EQ(get_group_option(second, 0, "momentum"), expected_momentum[i]) << "iteration " << i;
  }
}

}  // namespace
}  // namespace lockstep
