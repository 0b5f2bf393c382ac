#include "lockstep/optim/optimizer_builder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace nn = torch::nn;
namespace optim = torch::optim;

// conv(+bias) -> bn -> backbone{fc1, ln} -> head(+bias), plus a frozen scale on the root.
struct NetImpl : nn::Module {
  NetImpl() {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(1, 2, 3)));
    bn = register_module("bn", nn::BatchNorm2d(2));
    backbone = register_module("backbone", std::make_shared<nn::Module>());
    fc1 = backbone->register_module("fc1", nn::Linear(4, 4));
    ln = backbone->register_module("ln", nn::LayerNorm(nn::LayerNormOptions({4})));
    head = register_module("head", nn::Linear(4, 2));
    frozen = register_parameter("frozen", torch::ones({1}), /*requires_grad=*/false);
    root_bias = register_parameter("bias", torch::zeros({2}));
  }
  nn::Conv2d conv{nullptr};
  nn::BatchNorm2d bn{nullptr};
  std::shared_ptr<nn::Module> backbone;
  nn::Linear fc1{nullptr};
  nn::LayerNorm ln{nullptr};
  nn::Linear head{nullptr};
  torch::Tensor frozen, root_bias;
};
TORCH_MODULE(Net);

Config yaml(const std::string& text) { return parse_config(text, "optim.yaml"); }

double lr_of(const optim::Optimizer& o, size_t g) { return get_group_option(o, g, "lr"); }
double wd_of(const optim::Optimizer& o, size_t g) { return get_group_option(o, g, "weight_decay"); }

std::string build_error(const std::string& optimizer, const std::string& paramwise = "") {
  Net net;
  try {
    build_optimizer(yaml(optimizer), paramwise.empty() ? Config() : yaml(paramwise), *net);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(OptimizerBuilderTest, NormParametersAreFoundFromTheModuleTree) {
  Net net;
  EXPECT_THAT(norm_parameter_names(*net),
              ElementsAre("backbone.ln.bias", "backbone.ln.weight", "bn.bias", "bn.weight"));
  EXPECT_TRUE(is_norm_module(*net->bn));
  EXPECT_FALSE(is_norm_module(*net->head));
}

TEST(OptimizerBuilderTest, WithoutParamwiseEveryTrainableParameterIsInOneGroup) {
  Net net;
  auto built = build_optimizer_with_groups(yaml("{type: SGD, lr: 0.1, momentum: 0.9}"), Config(), *net);
  ASSERT_EQ(built.optimizer->param_groups().size(), 1u);
  EXPECT_THAT(built.groups[0].param_names,
              ElementsAre("bias", "conv.weight", "conv.bias", "bn.weight", "bn.bias", "backbone.fc1.weight",
                          "backbone.fc1.bias", "backbone.ln.weight", "backbone.ln.bias", "head.weight",
                          "head.bias"));
  EXPECT_EQ(built.optimizer->param_groups()[0].params().size(), 11u);  // "frozen" left out
  EXPECT_TRUE(built.optimizer->param_groups()[0].params()[1].is_same(net->conv->weight));
  EXPECT_EQ(get_group_option(*built.optimizer, 0, "momentum"), 0.9);
}

TEST(OptimizerBuilderTest, BiasAndNormMultipliersFollowMmengine) {
  Net net;
  auto built = build_optimizer_with_groups(
      yaml("{type: SGD, lr: 0.1, weight_decay: 0.01}"),
      yaml("{bias_lr_mult: 2.0, bias_decay_mult: 0.5, norm_decay_mult: 0.0}"), *net);
  auto& o = *built.optimizer;
  // Groups in order of first appearance: root bias (a bias), conv.weight (plain), bn (norm).
  ASSERT_EQ(o.param_groups().size(), 3u);
  EXPECT_THAT(built.groups[0].param_names, ElementsAre("bias", "conv.bias", "backbone.fc1.bias", "head.bias"));
  EXPECT_EQ(lr_of(o, 0), 0.1 * 2.0);
  EXPECT_EQ(wd_of(o, 0), 0.01 * 0.5);
  EXPECT_THAT(built.groups[1].param_names, ElementsAre("conv.weight", "backbone.fc1.weight", "head.weight"));
  EXPECT_EQ(lr_of(o, 1), 0.1);
  EXPECT_EQ(wd_of(o, 1), 0.01);
  // A norm layer's bias keeps the plain lr (bias_lr_mult skips norms) and takes norm_decay_mult.
  EXPECT_THAT(built.groups[2].param_names,
              ElementsAre("bn.weight", "bn.bias", "backbone.ln.weight", "backbone.ln.bias"));
  EXPECT_EQ(lr_of(o, 2), 0.1);
  EXPECT_EQ(wd_of(o, 2), 0.0);
  EXPECT_EQ(built.groups[2].lr_mult, 1.0);
  EXPECT_EQ(built.groups[2].decay_mult, 0.0);
}

TEST(OptimizerBuilderTest, LongestCustomKeyWinsAndOverridesBiasRules) {
  Net net;
  auto built = build_optimizer_with_groups(yaml("{type: AdamW, lr: 0.001, weight_decay: 0.05}"), yaml(R"(
    bias_lr_mult: 3.0
    custom_keys:
      backbone: {lr_mult: 0.1}
      backbone.fc1: {lr_mult: 0.5, decay_mult: 0.0}
      head: {decay_mult: 2.0}
  )"),
                                           *net);
  auto& o = *built.optimizer;
  std::map<std::string, std::pair<double, double>> by_name;  // name -> (lr, wd)
  for (size_t g = 0; g < built.groups.size(); ++g) {
    for (const auto& name : built.groups[g].param_names) by_name[name] = {lr_of(o, g), wd_of(o, g)};
  }
  EXPECT_EQ(by_name["backbone.fc1.weight"], std::make_pair(0.001 * 0.5, 0.05 * 0.0));
  EXPECT_EQ(by_name["backbone.fc1.bias"], std::make_pair(0.001 * 0.5, 0.05 * 0.0));  // not bias_lr_mult
  EXPECT_EQ(by_name["backbone.ln.weight"], std::make_pair(0.001 * 0.1, 0.05));
  EXPECT_EQ(by_name["head.bias"], std::make_pair(0.001, 0.05 * 2.0));
  EXPECT_EQ(by_name["conv.bias"], std::make_pair(0.001 * 3.0, 0.05));
  EXPECT_EQ(by_name["conv.weight"], std::make_pair(0.001, 0.05));
}

TEST(OptimizerBuilderTest, EqualLengthKeysPickTheAlphabeticallyFirstAndRootParamsMatchWithADot) {
  Net net;
  auto built = build_optimizer_with_groups(yaml("{type: SGD, lr: 1.0}"), yaml(R"(
    custom_keys:
      ".bias": {lr_mult: 0.25}
      "nv.w": {lr_mult: 0.5}
      "conv": {lr_mult: 0.75}
  )"),
                                           *net);
  std::map<std::string, double> lr;
  for (size_t g = 0; g < built.groups.size(); ++g) {
    for (const auto& name : built.groups[g].param_names) lr[name] = lr_of(*built.optimizer, g);
  }
  EXPECT_EQ(lr["bias"], 0.25);  // the root's "bias" is matched as ".bias"
  // "conv.weight" matches "conv" and "nv.w" (both 4 long): "conv" < "nv.w".
  EXPECT_EQ(lr["conv.weight"], 0.75);
  EXPECT_EQ(lr["conv.bias"], 0.25);  // ".bias" (5) is longer than "conv" (4)
  EXPECT_EQ(lr["head.weight"], 1.0);
}

TEST(OptimizerBuilderTest, NamedParamsOverloadTakesNormNamesAndSkipsDuplicates) {
  auto shared = torch::randn({3}, torch::requires_grad());
  auto norm_w = torch::randn({3}, torch::requires_grad());
  NamedParams params = {{"a.weight", torch::randn({2, 3}, torch::requires_grad())},
                        {"a.norm.weight", norm_w},
                        {"tied.x", shared},
                        {"tied_again.x", shared}};
  auto built = build_optimizer_with_groups(yaml("{type: SGD, lr: 0.1, weight_decay: 0.1}"),
                                           yaml("{norm_decay_mult: 0.0}"), params, {"a.norm.weight"});
  ASSERT_EQ(built.groups.size(), 2u);
  EXPECT_THAT(built.groups[0].param_names, ElementsAre("a.weight", "tied.x"));
  EXPECT_THAT(built.groups[1].param_names, ElementsAre("a.norm.weight"));
  EXPECT_EQ(wd_of(*built.optimizer, 1), 0.0);
}

TEST(OptimizerBuilderTest, OptimizerDefaultsAndOptions) {
  Net net;
  auto adam = build_optimizer(yaml("{type: Adam, betas: [0.8, 0.9], amsgrad: true}"), Config(), *net);
  const auto& a = static_cast<const optim::AdamOptions&>(adam->param_groups()[0].options());
  EXPECT_EQ(a.lr(), 1e-3);
  EXPECT_EQ(std::get<0>(a.betas()), 0.8);
  EXPECT_EQ(std::get<1>(a.betas()), 0.9);
  EXPECT_TRUE(a.amsgrad());
  EXPECT_EQ(a.weight_decay(), 0.0);
  auto adamw = build_optimizer(yaml("{type: AdamW}"), Config(), *net);
  EXPECT_EQ(wd_of(*adamw, 0), 1e-2);
  EXPECT_NE(dynamic_cast<optim::AdamW*>(adamw.get()), nullptr);
  auto rms = build_optimizer(yaml("{type: RMSprop, momentum: 0.5, centered: true}"), Config(), *net);
  const auto& r = static_cast<const optim::RMSpropOptions&>(rms->param_groups()[0].options());
  EXPECT_EQ(r.lr(), 1e-2);
  EXPECT_EQ(r.momentum(), 0.5);
  EXPECT_TRUE(r.centered());
  auto sgd = build_optimizer(yaml("{type: SGD, lr: 0.1, momentum: 0.9, nesterov: true}"), Config(), *net);
  EXPECT_TRUE(static_cast<const optim::SGDOptions&>(sgd->param_groups()[0].options()).nesterov());
}

TEST(OptimizerBuilderTest, BadValuesNameTheKeyAndLine) {
  EXPECT_THAT(build_error("{type: SGD, lr: -0.1}"), HasSubstr("optim.yaml:1 (key lr): lr must be positive, got -0.1"));
  EXPECT_THAT(build_error("{type: SGD}"), HasSubstr("missing key 'lr'"));
  EXPECT_THAT(build_error("{type: SGD, lr: 0.1, momentum: 1.0}"), HasSubstr("momentum must be in [0, 1), got 1"));
  EXPECT_THAT(build_error("{type: Adam, betas: [0.9, 1.5]}"), HasSubstr("betas[1] must be in [0, 1), got 1.5"));
  EXPECT_THAT(build_error("{type: Adam, betas: [0.9]}"), HasSubstr("betas must be a list of two numbers"));
  EXPECT_THAT(build_error("{type: Adam, eps: 0}"), HasSubstr("eps must be positive, got 0"));
  EXPECT_THAT(build_error("{type: AdamW, weight_decay: -1}"), HasSubstr("weight_decay must be non-negative"));
  EXPECT_THAT(build_error("{type: SGD, lr: 0.1, nesterov: true}"), HasSubstr("nesterov needs momentum > 0"));
  EXPECT_THAT(build_error("{type: SGD, lr: 0.1, momentun: 0.9}"), HasSubstr("momentun"));
  EXPECT_THAT(build_error("{type: Adamm}"), HasSubstr("unknown optimizer type 'Adamm'"));
}

TEST(OptimizerBuilderTest, AdagradHasTorchOptimsKeysAndDefaults) {
  Net net;
  auto adagrad = build_optimizer(yaml("{type: Adagrad}"), Config(), *net);
  ASSERT_NE(dynamic_cast<optim::Adagrad*>(adagrad.get()), nullptr);
  const auto& a = static_cast<const optim::AdagradOptions&>(adagrad->param_groups()[0].options());
  EXPECT_EQ(a.lr(), 1e-2);
  EXPECT_EQ(a.lr_decay(), 0.0);
  EXPECT_EQ(a.weight_decay(), 0.0);
  EXPECT_EQ(a.initial_accumulator_value(), 0.0);
  EXPECT_EQ(a.eps(), 1e-10);
  auto tuned = build_optimizer(yaml("{type: Adagrad, lr: 0.1, lr_decay: 0.01, weight_decay: 1.0e-4, "
                                    "initial_accumulator_value: 0.5, eps: 1.0e-8}"),
                               Config(), *net);
  const auto& t = static_cast<const optim::AdagradOptions&>(tuned->param_groups()[0].options());
  EXPECT_EQ(t.lr(), 0.1);
  EXPECT_EQ(t.lr_decay(), 0.01);
  EXPECT_EQ(t.weight_decay(), 1e-4);
  EXPECT_EQ(t.initial_accumulator_value(), 0.5);
  EXPECT_EQ(t.eps(), 1e-8);

  EXPECT_THAT(build_error("{type: Adagrad, lr: -0.1}"),
              HasSubstr("optim.yaml:1 (key lr): lr must be positive, got -0.1"));
  EXPECT_THAT(build_error("{type: Adagrad, lr_decay: -1}"),
              HasSubstr("(key lr_decay): lr_decay must be non-negative"));
  EXPECT_THAT(build_error("{type: Adagrad, initial_accumulator_value: -1}"),
              HasSubstr("(key initial_accumulator_value): initial_accumulator_value must be non-negative"));
  EXPECT_THAT(build_error("{type: Adagrad, maximize: true}"), HasSubstr("maximize"));
}

TEST(OptimizerBuilderTest, LbfgsIsRefusedWithTheReason) {
  const std::string message = build_error("{type: LBFGS, lr: 1}");
  EXPECT_THAT(message, HasSubstr("optim.yaml:1 (key type): LBFGS cannot be trained by lockstep"));
  EXPECT_THAT(message, HasSubstr("closure"));
}

TEST(OptimizerBuilderTest, BadParamwiseConfigIsExplained) {
  EXPECT_THAT(build_error("{type: SGD, lr: 0.1}", "{norm_decay_mult: 0.0}"),
              HasSubstr("paramwise_cfg.norm_decay_mult needs weight_decay to be set in the optimizer config"));
  EXPECT_THAT(build_error("{type: SGD, lr: 0.1}", "{custom_keys: {head: {decay_mult: 0.0}}}"),
              HasSubstr("custom_keys.head.decay_mult needs weight_decay"));
  EXPECT_THAT(build_error("{type: SGD, lr: 0.1}", "{bias_lr_mult: -1}"),
              HasSubstr("bias_lr_mult must be non-negative"));
  EXPECT_THAT(build_error("{type: SGD, lr: 0.1}", "{flat_decay_mult: 0.0}"), HasSubstr("flat_decay_mult"));
  EXPECT_THAT(build_error("{type: SGD, lr: 0.1}", "{custom_keys: {head: {lr_mul: 2}}}"), HasSubstr("lr_mul"));
}

TEST(OptimizerBuilderTest, NoTrainableParametersIsAnError) {
  NamedParams frozen = {{"w", torch::zeros({2})}};
  EXPECT_THAT([&] { build_optimizer(yaml("{type: SGD, lr: 0.1}"), Config(), frozen); },
              ::testing::ThrowsMessage<Error>(HasSubstr("no trainable parameters")));
}

TEST(OptimizerBuilderTest, CustomOptimizerTypesCanBeRegistered) {
  if (!optimizer_registry().contains("TestAdagrad")) {
    optimizer_registry().add("TestAdagrad", [](const Config& cfg, std::vector<optim::OptimizerParamGroup> groups) {
      return std::make_shared<optim::Adagrad>(std::move(groups), optim::AdagradOptions(cfg.get<double>("lr")));
    });
  }
  Net net;
  auto built = build_optimizer_with_groups(yaml("{type: TestAdagrad, lr: 0.5}"), yaml("{bias_lr_mult: 0.5}"), *net);
  EXPECT_EQ(lr_of(*built.optimizer, 0), 0.25);
  EXPECT_EQ(lr_of(*built.optimizer, 1), 0.5);
}

}  // namespace
}  // namespace lockstep
