#include "lockstep/optim/param_groups.h"

#include "lockstep/core/error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace {

using ::testing::HasSubstr;

std::vector<torch::Tensor> one_param() { return {torch::zeros({2}, torch::requires_grad())}; }

TEST(ParamGroupsTest, SgdMomentumAndWeightDecayAreItsOwnOptions) {
  torch::optim::SGD sgd(one_param(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4));
  EXPECT_EQ(optimizer_type_name(sgd), "SGD");
  EXPECT_EQ(get_group_option(sgd, 0, "lr"), 0.1);
  EXPECT_EQ(get_group_option(sgd, 0, "momentum"), 0.9);
  EXPECT_EQ(get_group_option(sgd, 0, "weight_decay"), 1e-4);
  set_group_option(sgd, 0, "momentum", 0.5);
  set_group_option(sgd, 0, "lr", 0.25);
  const auto& options = static_cast<const torch::optim::SGDOptions&>(sgd.param_groups()[0].options());
  EXPECT_EQ(options.momentum(), 0.5);
  EXPECT_EQ(options.lr(), 0.25);
}

TEST(ParamGroupsTest, AdamMomentumIsBeta1AndBeta2IsUntouched) {
  torch::optim::Adam adam(one_param(), torch::optim::AdamOptions(1e-3).betas({0.8, 0.99}));
  EXPECT_EQ(get_group_option(adam, 0, "momentum"), 0.8);
  set_group_option(adam, 0, "momentum", 0.7);
  const auto& options = static_cast<const torch::optim::AdamOptions&>(adam.param_groups()[0].options());
  EXPECT_EQ(std::get<0>(options.betas()), 0.7);
  EXPECT_EQ(std::get<1>(options.betas()), 0.99);
}

TEST(ParamGroupsTest, AdamWAndRmspropExposeTheirOptions) {
  torch::optim::AdamW adamw(one_param(), torch::optim::AdamWOptions(2e-3).betas({0.85, 0.9}));
  EXPECT_EQ(optimizer_type_name(adamw), "AdamW");
  EXPECT_EQ(get_group_option(adamw, 0, "momentum"), 0.85);
  EXPECT_EQ(get_group_option(adamw, 0, "weight_decay"), 1e-2);  // AdamW's own default
  torch::optim::RMSprop rmsprop(one_param(), torch::optim::RMSpropOptions(0.01).momentum(0.3));
  EXPECT_EQ(get_group_option(rmsprop, 0, "momentum"), 0.3);
}

TEST(ParamGroupsTest, MissingOptionNamesTheOptimizerTypeAndWhatItHas) {
  torch::optim::Adagrad adagrad(one_param(), torch::optim::AdagradOptions(0.1));
  EXPECT_TRUE(has_group_option(adagrad, "weight_decay"));
  EXPECT_FALSE(has_group_option(adagrad, "momentum"));
  try {
    get_group_option(adagrad, 0, "momentum");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("Adagrad has no option 'momentum'"));
    EXPECT_THAT(error.what(), HasSubstr("lr, weight_decay"));
  }
  torch::optim::LBFGS lbfgs(one_param(), torch::optim::LBFGSOptions(1));
  EXPECT_THROW(set_group_option(lbfgs, 0, "weight_decay", 0.1), Error);
}

TEST(ParamGroupsTest, GroupOutOfRangeAndUnknownOptionAreErrors) {
  torch::optim::SGD sgd(one_param(), torch::optim::SGDOptions(0.1));
  EXPECT_THAT([&] { get_group_option(sgd, 3, "lr"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("SGD has 1 parameter group(s); there is no group 3")));
  EXPECT_THAT([&] { get_group_option(sgd, 0, "betas"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("unknown parameter-group option 'betas'")));
}

TEST(ParamGroupsTest, GetGroupOptionsReadsEveryGroup) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(one_param(), std::make_unique<torch::optim::SGDOptions>(0.1));
  groups.emplace_back(one_param(), std::make_unique<torch::optim::SGDOptions>(0.2));
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.5));
  EXPECT_EQ(get_group_options(sgd, "lr"), (std::vector<double>{0.1, 0.2}));
  set_group_option(sgd.param_groups()[1], "lr", 0.3);
  EXPECT_EQ(get_group_option(sgd.param_groups()[1], "lr"), 0.3);
}

}  // namespace
}  // namespace lockstep
