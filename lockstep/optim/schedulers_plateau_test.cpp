// ReduceOnPlateauLR against PyTorch's ReduceLROnPlateau (Debian's
// python3-torch) on the same metric sequences: the learning rate of every
// param group after every pass, exactly; and a resumed scheduler continues
// the same trajectory.
#include "lockstep/optim/schedulers_plateau.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "lockstep/core/read_file.h"
#include "lockstep/optim/param_groups.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

const char* kReference = R"PY(
import json, sys, torch
cases = json.load(open(sys.argv[1]))
out = []
for case in cases:
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 0.1}, {"params": [params[1]], "lr": 0.03}], lr=0.1)
    s = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode=case["mode"], factor=case["factor"], patience=case["patience"],
        threshold=case["threshold"], threshold_mode=case["threshold_mode"], cooldown=case["cooldown"],
        min_lr=case["min_lr"], eps=case["eps"])
    lrs = []
    for value in case["metrics"]:
        s.step(value)
        lrs.append([g["lr"] for g in opt.param_groups])
    out.append(lrs)
json.dump(out, open(sys.argv[2], "w"))
)PY";

struct Case {
  std::string rule, threshold_rule;
  double factor, threshold;
  int64_t patience, cooldown;
  std::vector<double> min_value;
  std::vector<double> metrics;
};

std::vector<Case> cases() {
  std::vector<double> wavy;
  for (int i = 0; i < 60; ++i) wavy.push_back(1.0 / (1 + i / 7) + 0.01 * ((i * 37) % 11));
  std::vector<double> rising;
  for (int i = 0; i < 60; ++i) rising.push_back(0.5 + 0.1 * std::log(1.0 + i % 13 + i / 13));
  return {{"less", "rel", 0.5, 1e-4, 2, 0, {0.0}, wavy},
          {"less", "abs", 0.3, 0.02, 1, 2, {0.004, 0.001}, wavy},
          {"greater", "rel", 0.1, 1e-3, 3, 1, {0.0}, rising},
          {"greater", "abs", 0.7, 0.05, 0, 0, {0.02}, rising}};
}

TEST(ReduceOnPlateau, LearningRatesEqualPyTorchsReduceLROnPlateau) {
  if (!testing::python_has("torch")) GTEST_SKIP() << "no python3-torch";
  testing::TempDir dir;
  nlohmann::json spec = nlohmann::json::array();
  for (const Case& c : cases()) {
    spec.push_back({{"mode", c.rule == "less" ? "min" : "max"}, {"factor", c.factor}, {"patience", c.patience},
                    {"threshold", c.threshold}, {"threshold_mode", c.threshold_rule}, {"cooldown", c.cooldown},
                    {"min_lr", c.min_value.size() == 1 ? nlohmann::json(c.min_value[0]) : nlohmann::json(c.min_value)},
                    {"eps", 1e-8}, {"metrics", c.metrics}});
  }
  testing::write_file(dir.file("cases.json"), spec.dump());
  testing::write_file(dir.file("reference.py"), kReference);
  auto result = testing::run_command(
      {testing::python(), dir.file("reference.py"), dir.file("cases.json"), dir.file("lrs.json")}, {}, 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto reference = nlohmann::json::parse(read_file(dir.file("lrs.json")));
  int reductions = 0;
  for (size_t k = 0; k < cases().size(); ++k) {
    const Case c = cases()[k];
    auto a = torch::zeros({1}, torch::requires_grad()), b = torch::zeros({1}, torch::requires_grad());
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{a}, std::make_unique<torch::optim::SGDOptions>(0.1));
    groups.emplace_back(std::vector<torch::Tensor>{b}, std::make_unique<torch::optim::SGDOptions>(0.03));
    torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.1));
    auto options = PlateauOptions()
                       .rule(c.rule)
                       .threshold_rule(c.threshold_rule)
                       .factor(c.factor)
                       .threshold(c.threshold)
                       .patience(c.patience)
                       .cooldown(c.cooldown)
                       .min_value(c.min_value)
                       .monitor("m");
    ReduceOnPlateauScheduler scheduler(sgd, options, ScheduleSpan());
    std::unique_ptr<ReduceOnPlateauScheduler> resumed;
    for (size_t i = 0; i < c.metrics.size(); ++i) {
      scheduler.step();  // an iteration passes between evaluations
      scheduler.step_with_metrics({{"m", c.metrics[i]}});
      for (size_t g = 0; g < 2; ++g) {
        EXPECT_EQ(get_group_option(sgd, g, "lr"), reference[k][i][g].get<double>())
            << "case " << k << ", pass " << i << ", group " << g;
      }
      if (i + 1 < c.metrics.size() && reference[k][i + 1][0] != reference[k][i][0]) ++reductions;
    }
    // Resume halfway: a new scheduler, the state loaded, the rest of the sequence.
    auto c2 = torch::zeros({1}, torch::requires_grad()), d2 = torch::zeros({1}, torch::requires_grad());
    std::vector<torch::optim::OptimizerParamGroup> groups2;
    groups2.emplace_back(std::vector<torch::Tensor>{c2}, std::make_unique<torch::optim::SGDOptions>(0.1));
    groups2.emplace_back(std::vector<torch::Tensor>{d2}, std::make_unique<torch::optim::SGDOptions>(0.03));
    torch::optim::SGD first_half(groups2, torch::optim::SGDOptions(0.1));
    ReduceOnPlateauScheduler before(first_half, options, ScheduleSpan());
    const size_t half = c.metrics.size() / 2;
    for (size_t i = 0; i < half; ++i) {
      before.step();
      before.step_with_metrics({{"m", c.metrics[i]}});
    }
    ReduceOnPlateauScheduler after(first_half, options, ScheduleSpan());
    after.load_state(before.state());
    for (size_t i = half; i < c.metrics.size(); ++i) {
      after.step();
      after.step_with_metrics({{"m", c.metrics[i]}});
      EXPECT_EQ(get_group_option(first_half, 0, "lr"), reference[k][i][0].get<double>()) << "resumed, case " << k << ", pass " << i;
    }
  }
  EXPECT_GE(reductions, 6) << "the sequences should exercise several reductions";
}

TEST(ReduceOnPlateau, AMissingMetricAndBadOptionsAreNamed) {
  auto a = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd(std::vector<torch::Tensor>{a}, torch::optim::SGDOptions(0.1));
  ReduceOnPlateauScheduler scheduler(sgd, PlateauOptions().monitor("loss"), ScheduleSpan());
  EXPECT_THAT(testing::error_of([&] { scheduler.step_with_metrics({{"accuracy", 1.0}}); }),
              ::testing::HasSubstr("no 'loss' to monitor (they are: accuracy)"));
  EXPECT_THROW(ReduceOnPlateauScheduler(sgd, PlateauOptions().factor(1.5), ScheduleSpan()), OptionError);
  EXPECT_THAT(testing::error_of([&] {
                scheduler_registry().build(parse_config("{type: ReduceOnPlateauLR, rule: up}", "s.yaml"), sgd, SchedulerContext{});
              }),
              ::testing::HasSubstr("s.yaml:1"));
}

}  // namespace
}  // namespace lockstep
