// The multi-tensor (foreach) steps of SGD, Adam and AdamW and the foreach
// norm clip against the one-tensor-at-a-time ones, on the CPU, where the two
// give the same bits (Note [foreach as Python chooses it]). That each is
// Python's own is the differential suite's part (DDP_AdamW_Foreach_Clip,
// DDP_SGD_Nesterov_Foreach, and on a GPU every default case).
#include "lockstep/optim/foreach_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/device_side_step.h"
#include "lockstep/optim/internal/foreach_groups.h"
#include "lockstep/optim/optim_wrapper.h"
#include "lockstep/optim/optimizer_builder.h"
#include "lockstep/optim/sgd.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
namespace optim = torch::optim;

// Two groups of parameters in two dtypes (so a group's foreach calls come in
// two parts), the same values for every seed.
std::vector<torch::Tensor> foreach_params() {
  torch::manual_seed(3);
  return {torch::randn({4, 3}), torch::randn({5}), torch::randn({2, 2, 3}, torch::kDouble), torch::randn({3}),
          torch::randn({6}, torch::kDouble)};
}

std::vector<optim::OptimizerParamGroup> foreach_param_groups(const std::vector<torch::Tensor>& params) {
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1], params[2]});
  groups.emplace_back(std::vector<torch::Tensor>{params[3], params[4]});
  return groups;
}

// Gradients for step `step`; parameter 3 has none at step 0, so its first
// step (and the first momentum buffer) comes after the others'.
void set_foreach_grads(std::vector<torch::Tensor>& params, int64_t step) {
  torch::manual_seed(100 + step);
  for (size_t i = 0; i < params.size(); ++i) {
    if (step == 0 && i == 3) continue;
    params[i].mutable_grad() = torch::randn_like(params[i]);
  }
}

void expect_same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

struct ForeachCase {
  std::string name;
  std::function<std::shared_ptr<optim::Optimizer>(const std::vector<torch::Tensor>&)> make;
};

std::vector<ForeachCase> foreach_cases() {
  auto sgd = [](optim::SGDOptions options) {
    return [options](const std::vector<torch::Tensor>& params) {
      auto made = std::make_shared<SGD>(foreach_param_groups(params), options);
      made->param_groups()[1].options().set_lr(0.02);
      return std::static_pointer_cast<optim::Optimizer>(made);
    };
  };
  auto adam = [](auto tag, auto options) {
    return [options](const std::vector<torch::Tensor>& params) {
      using Made = typename decltype(tag)::type;
      auto made = std::make_shared<Made>(foreach_param_groups(params), options);
      made->param_groups()[1].options().set_lr(0.004);
      return std::static_pointer_cast<optim::Optimizer>(made);
    };
  };
  struct AdamTag { using type = Adam; };
  struct AdamWTag { using type = AdamW; };
  return {
      {"SGD", sgd(optim::SGDOptions(0.1))},
      {"SGD momentum weight decay", sgd(optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3))},
      {"SGD nesterov", sgd(optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4))},
      {"SGD dampening", sgd(optim::SGDOptions(0.1).momentum(0.8).dampening(0.3))},
      {"Adam", adam(AdamTag{}, optim::AdamOptions(0.01).weight_decay(1e-2))},
      {"Adam amsgrad", adam(AdamTag{}, optim::AdamOptions(0.01).amsgrad(true))},
      {"AdamW", adam(AdamWTag{}, optim::AdamWOptions(0.01).betas({0.8, 0.95}).weight_decay(0.05))},
      {"AdamW amsgrad", adam(AdamWTag{}, optim::AdamWOptions(0.01).amsgrad(true))},
  };
}

TEST(ForeachStep, EveryOptimizerTakesTheSameStepsOneTensorAtATimeAndByForeach) {
  for (const auto& c : foreach_cases()) {
    SCOPED_TRACE(c.name);
    auto single_params = foreach_params();
    auto multi_params = foreach_params();
    auto single = c.make(single_params);
    auto foreach = c.make(multi_params);
    ASSERT_NE(foreach_choice(*foreach), nullptr);
    foreach_choice(*single)->set_foreach(false);
    foreach_choice(*foreach)->set_foreach(true);
    for (int64_t step = 0; step < 5; ++step) {
      set_foreach_grads(single_params, step);
      set_foreach_grads(multi_params, step);
      single->step();
      foreach->step();
    }
    expect_same_bits(single_params, multi_params);
    EXPECT_FALSE(torch::equal(single_params[3], foreach_params()[3])) << "parameter 3 must have stepped";
    // The same state too: a checkpoint of either resumes the other.
    ASSERT_EQ(single->state().size(), foreach->state().size());
  }
}

TEST(ForeachStep, ASparseGradientStepsItsGroupOneTensorAtATime) {
  std::vector<torch::Tensor> results;
  for (bool foreach : {false, true}) {
    auto param = torch::ones({4, 2});
    SGD sgd(std::vector<torch::Tensor>{param}, optim::SGDOptions(0.1));
    sgd.set_foreach(foreach);
    param.mutable_grad() = torch::sparse_coo_tensor(torch::tensor({{0, 2}}), torch::ones({2, 2}), {4, 2});
    sgd.step();
    results.push_back(param.clone());
  }
  EXPECT_TRUE(torch::equal(results[0], results[1]));
  EXPECT_FALSE(torch::equal(results[0], torch::ones({4, 2})));
}

TEST(ForeachStep, OnTheCpuTheDefaultIsOneTensorAtATimeAsInPython) {
  auto params = foreach_params();
  EXPECT_FALSE(detail::steps_foreach(std::nullopt, params));
  EXPECT_TRUE(detail::steps_foreach(true, params));
  EXPECT_FALSE(detail::steps_foreach(false, params));
  EXPECT_FALSE(detail::steps_foreach(std::nullopt, {}));
}

TEST(ForeachStep, PartsFollowDeviceAndDtypeInTheTensorsOrder) {
  auto parts = detail::by_device_and_dtype(foreach_params());
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], (std::vector<size_t>{0, 1, 3}));
  EXPECT_EQ(parts[1], (std::vector<size_t>{2, 4}));
}

Config foreach_yaml(const std::string& text) { return parse_config(text, "optim.yaml"); }

TEST(ForeachStep, TheYamlKeyForeachChoosesAndRefusesCapturable) {
  auto net = torch::nn::Linear(3, 2);
  for (const char* type : {"SGD", "Adam", "AdamW"}) {
    SCOPED_TRACE(type);
    auto chosen = build_optimizer(foreach_yaml(std::string("{type: ") + type + ", lr: 0.1, foreach: true}"), Config(), *net);
    ASSERT_NE(foreach_choice(*chosen), nullptr);
    EXPECT_EQ(foreach_choice(*chosen)->foreach(), std::optional<bool>(true));
    auto unset = build_optimizer(foreach_yaml(std::string("{type: ") + type + ", lr: 0.1, foreach: null}"), Config(), *net);
    EXPECT_EQ(foreach_choice(*unset)->foreach(), std::nullopt);
    auto off = build_optimizer(foreach_yaml(std::string("{type: ") + type + ", lr: 0.1, foreach: false, capturable: true}"),
                               Config(), *net);
    EXPECT_TRUE(device_side_step(*off)->capturable());
    try {
      build_optimizer(foreach_yaml(std::string("{type: ") + type + ",\n lr: 0.1, foreach: true, capturable: true}"), Config(),
                      *net);
      FAIL() << "no error";
    } catch (const Error& error) {
      EXPECT_THAT(error.what(), HasSubstr("optim.yaml:2"));
      EXPECT_THAT(error.what(), HasSubstr("foreach"));
      EXPECT_THAT(error.what(), HasSubstr("cannot be captured"));
    }
  }
  EXPECT_THROW(build_optimizer(foreach_yaml("{type: SGD, lr: 0.1, foreach: maybe}"), Config(), *net), Error);
  // libtorch's own optimizers have one path: the key is unknown there.
  EXPECT_EQ(foreach_choice(*build_optimizer(foreach_yaml("{type: RMSprop, lr: 0.1}"), Config(), *net)), nullptr);
  EXPECT_THROW(build_optimizer(foreach_yaml("{type: RMSprop, lr: 0.1, foreach: true}"), Config(), *net), Error);
}

// The norm clip by _foreach_norm and _foreach_mul_ (clip_grad_norm_'s
// foreach path) against one norm and one mul_ per gradient: the same
// gradients, the same logged norm. In one dtype: with several, the two
// stack the norms in other orders (Note [foreach as Python chooses it]).
TEST(ForeachClip, TheForeachNormClipScalesLikeTheOneTensorAtATimeOne) {
  std::vector<std::vector<torch::Tensor>> clipped;
  std::vector<double> norms;
  for (bool foreach : {false, true}) {
    std::vector<torch::Tensor> params;
    for (const auto& param : foreach_params()) params.push_back(param.to(torch::kFloat));
    set_foreach_grads(params, 1);
    ClipGradOptions clip;
    clip.kind = ClipGradOptions::Kind::kNorm;
    clip.max_norm = 0.5;
    clip.foreach = foreach;
    OptimWrapper wrapper(std::make_shared<optim::SGD>(params, optim::SGDOptions(1.0)),
                         OptimWrapperOptions().clip_grad(clip));
    wrapper.step();
    clipped.push_back(params);
    norms.push_back(wrapper.last_update_metrics().at("grad_norm"));
  }
  EXPECT_GT(norms[0], 0.5) << "the test must clip";
  EXPECT_EQ(norms[0], norms[1]);
  expect_same_bits(clipped[0], clipped[1]);
}

}  // namespace
}  // namespace lockstep
