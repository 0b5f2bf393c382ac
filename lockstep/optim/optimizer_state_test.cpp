#include "lockstep/optim/optimizer_state.h"

#include "lockstep/core/error.h"

#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace {

using ::testing::HasSubstr;
namespace optim = torch::optim;

// Two groups of parameters with fixed, different shapes.
struct Params {
  std::vector<torch::Tensor> first;
  std::vector<torch::Tensor> second;

  static Params make(uint64_t seed) {
    torch::manual_seed(seed);
    Params p;
    p.first = {torch::randn({3, 4}).requires_grad_(), torch::randn({4}).requires_grad_()};
    p.second = {torch::randn({2, 2}).requires_grad_()};
    return p;
  }
  Params clone() const {
    Params p;
    for (const auto& t : first) p.first.push_back(t.detach().clone().requires_grad_());
    for (const auto& t : second) p.second.push_back(t.detach().clone().requires_grad_());
    return p;
  }
  std::vector<torch::Tensor> all() const {
    auto result = first;
    result.insert(result.end(), second.begin(), second.end());
    return result;
  }
};

template <typename Options>
std::vector<optim::OptimizerParamGroup> two_groups(const Params& p, Options second_options) {
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(p.first);
  groups.emplace_back(p.second, std::make_unique<Options>(second_options));
  return groups;
}

// A deterministic "loss": gradients that depend on the parameters and the step.
void train_steps(optim::Optimizer& optimizer, const Params& p, int first_step, int count) {
  for (int step = first_step; step < first_step + count; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (const auto& t : p.all()) loss = loss + (t * t * (1.0 + 0.1 * step)).sum() + t.sin().sum();
    loss.backward();
    optimizer.step();
  }
}

using Factory = std::function<std::unique_ptr<optim::Optimizer>(const Params&)>;

// Runs 6 steps straight, and 3 + save/load into a fresh optimizer + 3: the
// parameters must agree bit for bit.
void expect_bitwise_resume(const Factory& make) {
  Params reference = Params::make(7);
  Params resumed = reference.clone();
  auto uninterrupted = make(reference);
  train_steps(*uninterrupted, reference, 0, 6);

  auto first_half = make(resumed);
  train_steps(*first_half, resumed, 0, 3);
  State saved = save_optimizer_state(*first_half);
  // The checkpoint moves to another run: a new optimizer over equal parameters.
  Params fresh = resumed.clone();
  auto second_half = make(fresh);
  load_optimizer_state(*second_half, saved);
  first_half.reset();
  train_steps(*second_half, fresh, 3, 3);

  auto expected = reference.all();
  auto actual = fresh.all();
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::equal(expected[i], actual[i])) << "parameter " << i;
  }
}

TEST(OptimizerStateTest, SgdWithMomentumResumesBitwise) {
  expect_bitwise_resume([](const Params& p) {
    return std::make_unique<optim::SGD>(
        two_groups(p, optim::SGDOptions(0.05).momentum(0.8).nesterov(true)),
        optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  });
}

TEST(OptimizerStateTest, AdamWithAmsgradResumesBitwise) {
  expect_bitwise_resume([](const Params& p) {
    return std::make_unique<optim::Adam>(two_groups(p, optim::AdamOptions(2e-3).amsgrad(true)),
                                         optim::AdamOptions(1e-2).betas({0.8, 0.99}));
  });
}

TEST(OptimizerStateTest, AdamWResumesBitwise) {
  expect_bitwise_resume([](const Params& p) {
    return std::make_unique<optim::AdamW>(two_groups(p, optim::AdamWOptions(3e-3)),
                                          optim::AdamWOptions(1e-2).weight_decay(0.1));
  });
}

TEST(OptimizerStateTest, RmspropCenteredWithMomentumResumesBitwise) {
  expect_bitwise_resume([](const Params& p) {
    return std::make_unique<optim::RMSprop>(
        two_groups(p, optim::RMSpropOptions(1e-3).centered(true).momentum(0.5)),
        optim::RMSpropOptions(1e-2).momentum(0.9));
  });
}

TEST(OptimizerStateTest, LayoutIsKeyedByPositionWithOptionsAndSteps) {
  Params p = Params::make(1);
  optim::Adam adam(two_groups(p, optim::AdamOptions(2e-3)), optim::AdamOptions(1e-2).betas({0.8, 0.99}));
  train_steps(adam, p, 0, 2);
  State state = save_optimizer_state(adam);
  EXPECT_EQ(state.values["type"], "Adam");
  EXPECT_EQ(state.values["groups"][0]["num_params"], 2);
  EXPECT_EQ(state.values["groups"][1]["options"]["lr"], 2e-3);
  EXPECT_EQ(state.values["groups"][0]["options"]["betas"], nlohmann::json({0.8, 0.99}));
  EXPECT_EQ(state.values["params"]["1.0"]["step"], 2);
  ASSERT_TRUE(state.tensors.count("0.1.exp_avg_sq"));
  EXPECT_EQ(state.tensors.at("0.1.exp_avg_sq").sizes(), p.first[1].sizes());
  EXPECT_FALSE(state.tensors.count("0.0.max_exp_avg_sq"));  // amsgrad off
  EXPECT_EQ(state.tensors.size(), 6u);
}

TEST(OptimizerStateTest, LoadRestoresGroupOptions) {
  Params p = Params::make(2);
  optim::SGD source(two_groups(p, optim::SGDOptions(0.05)), optim::SGDOptions(0.1).momentum(0.9));
  static_cast<optim::SGDOptions&>(source.param_groups()[1].options()).lr(0.0123);
  State state = save_optimizer_state(source);
  optim::SGD target(two_groups(p, optim::SGDOptions(0.5)), optim::SGDOptions(0.7));
  load_optimizer_state(target, state);
  const auto& first = static_cast<const optim::SGDOptions&>(target.param_groups()[0].options());
  const auto& second = static_cast<const optim::SGDOptions&>(target.param_groups()[1].options());
  EXPECT_EQ(first.lr(), 0.1);
  EXPECT_EQ(first.momentum(), 0.9);
  EXPECT_EQ(second.lr(), 0.0123);
  EXPECT_TRUE(target.state().empty());  // never stepped: nothing to restore
}

TEST(OptimizerStateTest, LoadedBuffersDoNotAliasTheCheckpoint) {
  Params p = Params::make(3);
  optim::SGD source(p.all(), optim::SGDOptions(0.1).momentum(0.9));
  train_steps(source, p, 0, 1);
  State state = save_optimizer_state(source);
  torch::Tensor saved = state.tensors.at("0.0.momentum_buffer").clone();
  Params q = p.clone();
  optim::SGD target(q.all(), optim::SGDOptions(0.1).momentum(0.9));
  load_optimizer_state(target, state);
  train_steps(target, q, 1, 2);
  EXPECT_TRUE(torch::equal(state.tensors.at("0.0.momentum_buffer"), saved));
}

std::string load_error(optim::Optimizer& target, const State& state,
                       const std::vector<ParamGroupInfo>* names = nullptr) {
  try {
    load_optimizer_state(target, state, names);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(OptimizerStateTest, MismatchesAreNamedExactly) {
  Params p = Params::make(4);
  optim::Adam source(two_groups(p, optim::AdamOptions(2e-3)), optim::AdamOptions(1e-2));
  train_steps(source, p, 0, 1);
  State state = save_optimizer_state(source);

  optim::SGD sgd(p.all(), optim::SGDOptions(0.1));
  EXPECT_THAT(load_error(sgd, state), HasSubstr("the checkpoint holds Adam state but the optimizer is SGD"));

  optim::Adam one_group(p.all(), optim::AdamOptions(1e-2));
  EXPECT_THAT(load_error(one_group, state),
              HasSubstr("the checkpoint has 2 parameter group(s) but the optimizer has 1"));

  Params fewer = p.clone();
  fewer.first.pop_back();
  optim::Adam short_group(two_groups(fewer, optim::AdamOptions(2e-3)), optim::AdamOptions(1e-2));
  EXPECT_THAT(load_error(short_group, state),
              HasSubstr("group 0 has 2 parameter(s) in the checkpoint but 1 in the optimizer"));

  Params transposed = p.clone();
  transposed.first[0] = torch::randn({4, 3}).requires_grad_();
  optim::Adam wrong_shape(two_groups(transposed, optim::AdamOptions(2e-3)), optim::AdamOptions(1e-2));
  std::vector<ParamGroupInfo> names(2);
  names[0].param_names = {"fc.weight", "fc.bias"};
  names[1].param_names = {"head.weight"};
  const std::string message = load_error(wrong_shape, state, &names);
  EXPECT_THAT(message, HasSubstr("group 0, parameter 0 (fc.weight): 'exp_avg' has shape [3, 4] in the "
                                 "checkpoint but the parameter has shape [4, 3]"));
  // Nothing was changed by the failed load.
  EXPECT_TRUE(wrong_shape.state().empty());
  EXPECT_EQ(static_cast<const optim::AdamOptions&>(wrong_shape.param_groups()[1].options()).lr(), 2e-3);

  State missing = state;
  missing.tensors.erase("1.0.exp_avg_sq");
  optim::Adam target(two_groups(p, optim::AdamOptions(2e-3)), optim::AdamOptions(1e-2));
  EXPECT_THAT(load_error(target, missing),
              HasSubstr("group 1, parameter 0: the checkpoint has no 'exp_avg_sq' buffer"));

  State extra = state;
  extra.tensors["0.0.momentum_buffer"] = torch::zeros({3, 4});
  EXPECT_THAT(load_error(target, extra),
              HasSubstr("tensor '0.0.momentum_buffer' that Adam state does not use"));

  State out_of_range = state;
  out_of_range.values["params"]["1.5"] = {{"step", 1}};
  EXPECT_THAT(load_error(target, out_of_range), HasSubstr("parameter '1.5', which is not"));
}

TEST(OptimizerStateTest, UnsupportedOptimizerIsAnError) {
  Params p = Params::make(5);
  optim::Adagrad adagrad(p.all(), optim::AdagradOptions(0.1));
  EXPECT_THAT([&] { save_optimizer_state(adagrad); },
              ::testing::ThrowsMessage<Error>(HasSubstr("Adagrad is not supported")));
}

}  // namespace
}  // namespace lockstep
