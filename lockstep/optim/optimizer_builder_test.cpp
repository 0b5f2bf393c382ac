#include "lockstep/optim/optimizer_builder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
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

// Each paramwise_cfg (the first of a pair) with plain SGD is an error whose
// message holds the second.
void expect_sgd_paramwise_errors(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [paramwise, says] : cases) {
    EXPECT_THAT(build_error("{type: SGD, lr: 0.1}", paramwise), HasSubstr(says)) << paramwise;
  }
}

TEST(OptimizerBuilderTest, ModuleTraitsAreReadFromTheModuleTree) {
  Net net;
  const ParamOwners owners = param_owners(*net);
  ASSERT_EQ(owners.size(), 12u);  // every parameter, the frozen one too
  EXPECT_TRUE(owners.at("bn.weight").module.norm);
  EXPECT_TRUE(owners.at("backbone.ln.bias").module.norm);
  EXPECT_TRUE(owners.at("conv.weight").module.conv2d);
  // mmengine's test, in_channels == groups: a conv of one input channel is "depthwise".
  EXPECT_TRUE(owners.at("conv.weight").module.depthwise_conv);
  EXPECT_FALSE(module_traits(*nn::Conv2d(nn::Conv2dOptions(4, 8, 3))).depthwise_conv);
  EXPECT_FALSE(owners.at("head.bias").module.norm);
  EXPECT_FALSE(owners.at("bias").module.conv2d);
  EXPECT_TRUE(is_norm_module(*net->bn));
  EXPECT_FALSE(is_norm_module(*net->head));
  EXPECT_TRUE(module_traits(*nn::Conv2d(nn::Conv2dOptions(4, 4, 3).groups(4))).depthwise_conv);
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

// name -> (lr, weight decay) of its group, and that every group holds one parameter.
std::map<std::string, std::pair<double, double>> options_by_name(const BuiltOptimizer& built) {
  std::map<std::string, std::pair<double, double>> by_name;
  for (size_t g = 0; g < built.groups.size(); ++g) {
    EXPECT_EQ(built.groups[g].param_names.size(), 1u);
    by_name[built.groups[g].param_names[0]] = {lr_of(*built.optimizer, g), wd_of(*built.optimizer, g)};
  }
  return by_name;
}

TEST(OptimizerBuilderTest, WithParamwiseEveryParameterHasAGroupInModelOrder) {
  Net net;
  auto built = build_optimizer_with_groups(
      yaml("{type: SGD, lr: 0.1, weight_decay: 0.01}"),
      yaml("{bias_lr_mult: 2.0, bias_decay_mult: 0.5, norm_decay_mult: 0.0}"), *net);
  auto& o = *built.optimizer;
  // mmengine's add_params order (a module's own parameters, then its
  // children's), the frozen one left out: the order clip_grad sees.
  std::vector<std::string> names;
  for (const auto& group : built.groups) names.push_back(group.param_names.at(0));
  EXPECT_THAT(names, ElementsAre("bias", "conv.weight", "conv.bias", "bn.weight", "bn.bias", "backbone.fc1.weight",
                                 "backbone.fc1.bias", "backbone.ln.weight", "backbone.ln.bias", "head.weight",
                                 "head.bias"));
  ASSERT_EQ(o.param_groups().size(), 11u);
  EXPECT_TRUE(o.param_groups()[1].params().at(0).is_same(net->conv->weight));
  auto by_name = options_by_name(built);
  EXPECT_EQ(by_name["conv.bias"], std::make_pair(0.1 * 2.0, 0.01 * 0.5));
  EXPECT_EQ(by_name["bias"], std::make_pair(0.1 * 2.0, 0.01 * 0.5));
  EXPECT_EQ(by_name["conv.weight"], std::make_pair(0.1, 0.01));
  // A norm layer's bias keeps the plain lr (bias_lr_mult skips norms) and takes norm_decay_mult.
  EXPECT_EQ(by_name["bn.bias"], std::make_pair(0.1, 0.0));
  EXPECT_EQ(by_name["backbone.ln.weight"], std::make_pair(0.1, 0.0));
  EXPECT_EQ(built.groups[3].decay_mult, 0.0);
}

TEST(OptimizerBuilderTest, DecayRulesAreMmenginesChain) {
  // Without norm_decay_mult, a norm layer's bias falls through to
  // bias_decay_mult, as in mmengine's if/elif chain; flat_decay_mult takes
  // the 1-D parameters no earlier rule took (the root's "bias" is a bias).
  Net net;
  auto built = build_optimizer_with_groups(yaml("{type: SGD, lr: 0.1, weight_decay: 0.01}"),
                                           yaml("{bias_decay_mult: 0.5, flat_decay_mult: 0.25}"), *net);
  auto by_name = options_by_name(built);
  EXPECT_EQ(by_name["bn.bias"].second, 0.01 * 0.5);
  EXPECT_EQ(by_name["bn.weight"].second, 0.01 * 0.25);
  EXPECT_EQ(by_name["backbone.ln.weight"].second, 0.01 * 0.25);
  EXPECT_EQ(by_name["head.bias"].second, 0.01 * 0.5);
  EXPECT_EQ(by_name["head.weight"].second, 0.01);
}

// A deformable convolution of a user's own: its offsets come from a Conv2d
// named conv_offset, as in mmcv.
struct DeformConvImpl : nn::Module {
  DeformConvImpl() {
    weight = register_parameter("weight", torch::randn({4, 4, 3, 3}));
    conv_offset = register_module("conv_offset", nn::Conv2d(nn::Conv2dOptions(4, 18, 3)));
  }
  torch::Tensor weight;
  nn::Conv2d conv_offset{nullptr};
};
const bool kDeformConvRegistered = [] {
  add_module_traits_reader([](const nn::Module& module, ModuleTraits& traits) {
    if (dynamic_cast<const DeformConvImpl*>(&module) != nullptr) traits.deformable_conv = true;
  });
  return true;
}();

TEST(OptimizerBuilderTest, DepthwiseAndDeformableConvolutionsFollowMmengine) {
  nn::Module net;
  net.register_module("0", nn::Conv2d(nn::Conv2dOptions(4, 4, 3).groups(4)));
  net.register_module("1", std::make_shared<DeformConvImpl>());
  net.register_module("2", nn::Conv2d(nn::Conv2dOptions(4, 4, 1)));
  auto built = build_optimizer_with_groups(yaml("{type: SGD, lr: 0.1, weight_decay: 0.01}"), yaml(R"(
    dwconv_decay_mult: 0.0
    dcn_offset_lr_mult: 0.5
    bias_lr_mult: 2.0
    bias_decay_mult: 0.25
  )"),
                                           net);
  auto by_name = options_by_name(built);
  EXPECT_EQ(by_name["0.weight"], std::make_pair(0.1, 0.0));         // depthwise
  EXPECT_EQ(by_name["0.bias"], std::make_pair(0.2, 0.01 * 0.25));   // the bias rule comes first
  EXPECT_EQ(by_name["1.weight"], std::make_pair(0.1, 0.01));        // the deformable conv's own weight
  EXPECT_EQ(by_name["1.conv_offset.weight"], std::make_pair(0.05, 0.01));
  EXPECT_EQ(by_name["1.conv_offset.bias"], std::make_pair(0.05, 0.01));  // no bias rule inside a DCN
  EXPECT_EQ(by_name["2.weight"], std::make_pair(0.1, 0.01));        // 1x1, not depthwise
}

TEST(OptimizerBuilderTest, CustomKeysCarryAnyOptionOfTheOptimizer) {
  Net net;
  auto built = build_optimizer_with_groups(yaml("{type: SGD, lr: 0.1, momentum: 0.9, weight_decay: 0.01}"), yaml(R"(
    custom_keys:
      head: {momentum: 0.5, nesterov: true, lr_mult: 0.5}
      conv: {lr: 0.3, lr_mult: 0.5, weight_decay: 0.125}
  )"),
                                           *net);
  const auto& o = *built.optimizer;
  auto by_name = options_by_name(built);
  EXPECT_EQ(by_name["head.weight"], std::make_pair(0.05, 0.01));
  EXPECT_EQ(by_name["conv.weight"], std::make_pair(0.3, 0.125));  // written options win over the multipliers
  for (size_t g = 0; g < built.groups.size(); ++g) {
    const auto& options = static_cast<const optim::SGDOptions&>(o.param_groups()[g].options());
    const bool head = built.groups[g].param_names[0].rfind("head.", 0) == 0;
    EXPECT_EQ(options.momentum(), head ? 0.5 : 0.9) << built.groups[g].param_names[0];
    EXPECT_EQ(options.nesterov(), head) << built.groups[g].param_names[0];
  }
  auto adam = build_optimizer_with_groups(yaml("{type: Adam, lr: 0.1}"),
                                          yaml("{custom_keys: {head: {betas: [0.5, 0.75], eps: 0.001}}}"), *net);
  const auto& head = static_cast<const optim::AdamOptions&>(adam.optimizer->param_groups().back().options());
  EXPECT_EQ(std::get<0>(head.betas()), 0.5);
  EXPECT_EQ(std::get<1>(head.betas()), 0.75);
  EXPECT_EQ(head.eps(), 0.001);
}

TEST(OptimizerBuilderTest, ACustomKeyOptionTheOptimizerLacksIsAnErrorEvenWhereNothingMatches) {
  const std::string message = build_error("{type: Adam, lr: 0.1}", "{custom_keys: {nowhere: {momentum: 0.5}}}");
  EXPECT_THAT(message, HasSubstr("paramwise_cfg.custom_keys.nowhere"));
  EXPECT_THAT(message, HasSubstr("optim.yaml:1"));
  EXPECT_THAT(message, HasSubstr("momentum"));
  EXPECT_THAT(message, HasSubstr("betas"));  // what Adam reads
  expect_sgd_paramwise_errors({{"{custom_keys: {head: {betas: [0.5, 0.5]}}}", "paramwise_cfg.custom_keys.head"},
                               {"{custom_keys: {head: {momentum: 1.5}}}", "momentum must be in [0, 1), got 1.5"},
                               {"{custom_keys: {head: {foreach: true}}}", "foreach is chosen for the whole optimizer"}});
}

TEST(OptimizerBuilderTest, ASharedParameterNeedsBypassDuplicate) {
  auto shared = torch::randn({3}, torch::requires_grad());
  NamedParams params = {{"a.weight", torch::randn({2, 3}, torch::requires_grad())},
                        {"tied.x", shared},
                        {"tied_again.x", shared}};
  EXPECT_THAT([&] { build_optimizer(yaml("{type: SGD, lr: 0.1}"), yaml("{bias_lr_mult: 2}"), params); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("'tied_again.x' is the tensor 'tied.x'"),
                                                    HasSubstr("bypass_duplicate"))));
  auto built = build_optimizer_with_groups(yaml("{type: SGD, lr: 0.1}"), yaml("{bypass_duplicate: true}"), params);
  ASSERT_EQ(built.groups.size(), 2u);
  EXPECT_THAT(built.groups[1].param_names, ElementsAre("tied.x"));
  // Without paramwise_cfg, as model.parameters(): once, no error.
  auto plain = build_optimizer_with_groups(yaml("{type: SGD, lr: 0.1}"), Config(), params);
  EXPECT_THAT(plain.groups.at(0).param_names, ElementsAre("a.weight", "tied.x"));
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

TEST(OptimizerBuilderTest, NamedParamsOverloadSeesModulesThroughOwners) {
  NamedParams params = {{"a.weight", torch::randn({2, 3}, torch::requires_grad())},
                        {"a.norm.weight", torch::randn({3}, torch::requires_grad())}};
  ParamOwners owners;
  owners["a.norm.weight"].module.norm = true;
  auto built = build_optimizer_with_groups(yaml("{type: SGD, lr: 0.1, weight_decay: 0.1}"),
                                           yaml("{norm_decay_mult: 0.0}"), params, owners);
  ASSERT_EQ(built.groups.size(), 2u);
  EXPECT_EQ(wd_of(*built.optimizer, 0), 0.1);
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
  expect_sgd_paramwise_errors(
      {{"{norm_decay_mult: 0.0}", "paramwise_cfg.norm_decay_mult needs weight_decay to be set in the optimizer config"},
       {"{custom_keys: {head: {decay_mult: 0.0}}}", "custom_keys.head.decay_mult needs weight_decay"},
       {"{bias_lr_mult: -1}", "bias_lr_mult must be non-negative"},
       {"{flat_decay_mult: 0.0}", "flat_decay_mult"},
       {"{custom_keys: {head: {lr_mul: 2}}}", "lr_mul"}});
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
