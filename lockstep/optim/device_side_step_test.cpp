#include "lockstep/optim/device_side_step.h"

#include <functional>
#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/optimizer_builder.h"
#include "lockstep/optim/optimizer_state.h"
#include "lockstep/optim/sgd.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
namespace optim = torch::optim;

// Three parameters of fixed shapes, and gradients drawn per step from a seed.
std::vector<torch::Tensor> make_params() {
  torch::manual_seed(7);
  return {torch::randn({5, 3}).requires_grad_(), torch::randn({3}).requires_grad_(),
          torch::randn({2, 2}).requires_grad_()};
}

void set_grads(const std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(1000 + step);
  for (const auto& p : params) p.mutable_grad() = torch::randn_like(p);
}

using MakeOptimizer = std::function<std::shared_ptr<optim::Optimizer>(std::vector<torch::Tensor>)>;

struct Case {
  const char* name;
  MakeOptimizer make;
};

std::vector<Case> cases() {
  return {
      {"Adam", [](std::vector<torch::Tensor> p) {
         return std::make_shared<lockstep::Adam>(p, optim::AdamOptions(0.01).weight_decay(0.1));
       }},
      {"AdamAmsgrad", [](std::vector<torch::Tensor> p) {
         return std::make_shared<lockstep::Adam>(p, optim::AdamOptions(0.01).amsgrad(true).betas({0.8, 0.95}));
       }},
      {"AdamW", [](std::vector<torch::Tensor> p) {
         return std::make_shared<lockstep::AdamW>(p, optim::AdamWOptions(0.003).weight_decay(0.05));
       }},
      {"SGD", [](std::vector<torch::Tensor> p) { return std::make_shared<lockstep::SGD>(p, optim::SGDOptions(0.05)); }},
      {"SGDNesterov", [](std::vector<torch::Tensor> p) {
         return std::make_shared<lockstep::SGD>(
             p, optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(5e-4));
       }},
  };
}

DeviceSideStep& device(optim::Optimizer& optimizer) {
  DeviceSideStep* step = device_side_step(optimizer);
  EXPECT_NE(step, nullptr);
  return *step;
}

std::vector<torch::Tensor> detached(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> copies;
  for (const auto& p : params) copies.push_back(p.detach().clone());
  return copies;
}

void expect_bitwise(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ", tensor " << i;
}

// Runs `steps` steps with gradients of steps [first, first + steps); a
// schedule changes the learning rate on the host every step, as an
// iteration-based scheduler does, and the capturable step must see it.
void run(optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params, int first, int steps) {
  for (int i = first; i < first + steps; ++i) {
    set_grads(params, i);
    for (auto& group : optimizer.param_groups()) group.options().set_lr(0.01 * (1.0 + 0.1 * (i % 5)));
    optimizer.step();
  }
}

TEST(DeviceSideStepTest, CapturableStepsFollowThePlainOnesAndTheLearningRateSchedule) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto plain_params = make_params();
    auto plain = c.make(plain_params);
    auto device_params = make_params();
    auto capturable = c.make(device_params);
    device(*capturable).set_capturable(true);
    run(*plain, plain_params, 0, 30);
    run(*capturable, device_params, 0, 30);
    for (size_t i = 0; i < plain_params.size(); ++i) {
      // float32 bias corrections against double ones: the last bits only.
      EXPECT_TRUE(torch::allclose(device_params[i], plain_params[i], /*rtol=*/1e-5, /*atol=*/1e-6))
          << "tensor " << i << " differs by " << (device_params[i] - plain_params[i]).abs().max().item<double>();
      EXPECT_FALSE(torch::equal(device_params[i], make_params()[i])) << "tensor " << i << " never moved";
    }
  }
}

TEST(DeviceSideStepTest, AFoundInfLeavesEveryParameterAndStateBitwiseAndAZeroOneChangesNothing) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto params = make_params();
    auto optimizer = c.make(params);
    DeviceSideStep& step = device(*optimizer);
    step.set_capturable(true);
    run(*optimizer, params, 0, 3);

    // A skipped step: parameters, and the state a checkpoint saves, bitwise as before.
    const auto before = detached(params);
    const State state_before = save_optimizer_state(*optimizer);
    set_grads(params, 3);
    step.stage_host_values();
    step.step_on_device(torch::ones({1}));
    expect_bitwise(detached(params), before, "parameters after a skipped step");
    const State state_after = save_optimizer_state(*optimizer);
    EXPECT_EQ(state_after.values, state_before.values);
    ASSERT_EQ(state_after.tensors.size(), state_before.tensors.size());
    for (const auto& [name, tensor] : state_before.tensors) {
      EXPECT_TRUE(torch::equal(state_after.tensors.at(name), tensor)) << name;
    }

    // A flag of zero takes the step exactly as no flag does.
    auto twin_params = make_params();
    auto twin = c.make(twin_params);
    device(*twin).set_capturable(true);
    run(*twin, twin_params, 0, 3);
    for (int i = 3; i < 6; ++i) {
      set_grads(params, i);
      set_grads(twin_params, i);
      step.stage_host_values();
      step.step_on_device(torch::zeros({1}));
      device(*twin).stage_host_values();
      device(*twin).step_on_device(torch::Tensor());
    }
    expect_bitwise(detached(params), detached(twin_params), "parameters after steps with found_inf 0");
  }
}

TEST(DeviceSideStepTest, ASkippedFirstStepLeavesNoMomentumBehind) {
  // The scaler often skips fp16's first steps; the first step taken must
  // start the momentum buffer from its gradient, as in a run that began there.
  auto params = make_params();
  auto sgd = std::make_shared<lockstep::SGD>(params, optim::SGDOptions(0.05).momentum(0.9));
  sgd->set_capturable(true);
  set_grads(params, 0);
  sgd->stage_host_values();
  sgd->step_on_device(torch::ones({1}));
  run(*sgd, params, 1, 5);

  auto plain_params = make_params();
  auto plain = std::make_shared<lockstep::SGD>(plain_params, optim::SGDOptions(0.05).momentum(0.9));
  run(*plain, plain_params, 1, 5);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i], plain_params[i], 1e-5, 1e-6)) << "tensor " << i;
  }
}

TEST(DeviceSideStepTest, ACheckpointInTheMiddleResumesBitwise) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto whole_params = make_params();
    auto whole = c.make(whole_params);
    device(*whole).set_capturable(true);
    run(*whole, whole_params, 0, 12);

    auto first_params = make_params();
    auto first = c.make(first_params);
    device(*first).set_capturable(true);
    run(*first, first_params, 0, 5);
    const State saved = save_optimizer_state(*first);

    // The resumed optimizer is a new one over parameters holding the first half's values.
    std::vector<torch::Tensor> resumed_params;
    for (const auto& p : first_params) resumed_params.push_back(p.detach().clone().requires_grad_());
    auto resumed = c.make(resumed_params);
    device(*resumed).set_capturable(true);
    load_optimizer_state(*resumed, saved);
    run(*resumed, resumed_params, 5, 7);
    expect_bitwise(detached(resumed_params), detached(whole_params), "resumed against uninterrupted");

    // The first optimizer goes on from the same state too: syncing for the
    // checkpoint changed nothing on its device.
    run(*first, first_params, 5, 7);
    expect_bitwise(detached(first_params), detached(whole_params), "saved-from against uninterrupted");
  }
}

TEST(DeviceSideStepTest, TheStepCountACheckpointHoldsIsTheDevicesAndAPlainOptimizerReadsIt) {
  auto params = make_params();
  auto adam = std::make_shared<lockstep::Adam>(params, optim::AdamOptions(0.01));
  adam->set_capturable(true);
  run(*adam, params, 0, 4);
  set_grads(params, 4);
  adam->stage_host_values();
  adam->step_on_device(torch::ones({1}));  // skipped: not counted
  const State saved = save_optimizer_state(*adam);
  auto plain = std::make_shared<lockstep::Adam>(make_params(), optim::AdamOptions(0.01));
  load_optimizer_state(*plain, saved);
  for (const auto& entry : plain->state()) {
    EXPECT_EQ(static_cast<const optim::AdamParamState&>(*entry.second).step(), 4);
  }
}

Config capturable_yaml(const std::string& text) { return parse_config(text, "optim.yaml"); }

TEST(DeviceSideStepTest, TheYamlKeyCapturableTurnsItOnAndSgdRefusesDampening) {
  auto net = torch::nn::Linear(3, 2);
  for (const char* type : {"SGD", "Adam", "AdamW"}) {
    auto built = build_optimizer(capturable_yaml(std::string("{type: ") + type + ", lr: 0.1, capturable: true}"), Config(), *net);
    ASSERT_NE(device_side_step(*built), nullptr) << type;
    EXPECT_TRUE(device_side_step(*built)->capturable()) << type;
    auto plain = build_optimizer(capturable_yaml(std::string("{type: ") + type + ", lr: 0.1}"), Config(), *net);
    EXPECT_FALSE(device_side_step(*plain)->capturable()) << type;
  }
  try {
    build_optimizer(capturable_yaml("{type: SGD, lr: 0.1, momentum: 0.9, dampening: 0.1,\n capturable: true}"), Config(), *net);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("optim.yaml:2"));
    EXPECT_THAT(error.what(), HasSubstr("capturable"));
    EXPECT_THAT(error.what(), HasSubstr("dampening 0 only (got 0.1)"));
  }
  auto rmsprop = build_optimizer(capturable_yaml("{type: RMSprop, lr: 0.1}"), Config(), *net);
  EXPECT_EQ(device_side_step(*rmsprop), nullptr);
}

TEST(DeviceSideStepTest, BakedOptionsFollowEverythingButTheLearningRate) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto optimizer = c.make(make_params());
    const std::vector<double> before = device(*optimizer).baked_options();
    EXPECT_FALSE(before.empty());
    optimizer->param_groups().front().options().set_lr(123.0);
    EXPECT_EQ(device(*optimizer).baked_options(), before) << "the learning rate is read from the device";
    auto& options = optimizer->param_groups().front().options();
    if (auto* sgd = dynamic_cast<optim::SGDOptions*>(&options)) sgd->weight_decay(0.25);
    if (auto* adam = dynamic_cast<optim::AdamOptions*>(&options)) adam->betas({0.5, 0.9});
    if (auto* adamw = dynamic_cast<optim::AdamWOptions*>(&options)) adamw->betas({0.5, 0.9});
    EXPECT_NE(device(*optimizer).baked_options(), before) << "a scheduled option a replay would freeze";
  }
}

TEST(DeviceSideStepTest, AStepBeforeTheLearningRatesAreStagedIsRefused) {
  auto params = make_params();
  lockstep::AdamW adamw(params, optim::AdamWOptions(0.01));
  adamw.set_capturable(true);
  set_grads(params, 0);
  try {
    adamw.step_on_device(torch::Tensor());
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("before stage_host_values()"));
  }
}

}  // namespace
}  // namespace lockstep
