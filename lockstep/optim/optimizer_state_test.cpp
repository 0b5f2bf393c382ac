#include "lockstep/optim/optimizer_state.h"

#include "lockstep/compat/internal/optim.h"
#include "lockstep/core/error.h"

#include <functional>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/support/tiny_momentum.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace optim = torch::optim;

using testing::TinyBareParamState;
using testing::TinyMomentum;
using testing::TinyMomentumBase;
using testing::TinyOptions;
using testing::TinyParamState;

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

std::vector<optim::OptimizerParamGroup> one_group(const Params& p) {
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(p.all());
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
  // The checkpoint moves to another run, its values as JSON text: a new
  // optimizer over equal parameters.
  saved.values = nlohmann::json::parse(saved.values.dump());
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

TEST(OptimizerStateTest, AdagradResumesBitwise) {
  expect_bitwise_resume([](const Params& p) {
    return std::make_unique<optim::Adagrad>(
        two_groups(p, optim::AdagradOptions(0.05).lr_decay(0.01)),
        optim::AdagradOptions(0.1).weight_decay(1e-3).initial_accumulator_value(0.1));
  });
}

TEST(OptimizerStateTest, AnOptimizerOfYourOwnWithLoadResumesBitwise) {
  expect_bitwise_resume([](const Params& p) {
    return std::make_unique<TinyMomentum>(two_groups(p, TinyOptions(0.05)), TinyOptions(0.1).betas({0.9, 0.5}));
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

TEST(OptimizerStateTest, OtherTypesKeepWhatTheirSerializeWrites) {
  Params p = Params::make(5);
  optim::Adagrad adagrad(two_groups(p, optim::AdagradOptions(0.05)), optim::AdagradOptions(0.1).lr_decay(0.01));
  train_steps(adagrad, p, 0, 2);
  State state = save_optimizer_state(adagrad);
  EXPECT_EQ(state.values["type"], "Adagrad");
  EXPECT_EQ(state.values["groups"][0]["num_params"], 2);
  EXPECT_EQ(state.values["groups"][0]["options"]["lr_decay"], 0.01);
  EXPECT_EQ(state.values["groups"][1]["options"]["lr"], 0.05);
  EXPECT_EQ(state.values["groups"][1]["options"]["eps"], 1e-10);
  EXPECT_EQ(state.values["params"]["1.0"]["step"], 2);
  EXPECT_EQ(state.tensors.size(), 3u);
  ASSERT_TRUE(state.tensors.count("0.1.sum"));
  EXPECT_EQ(state.tensors.at("0.1.sum").sizes(), p.first[1].sizes());

  // Loading replaces the options too.
  Params q = p.clone();
  optim::Adagrad target(two_groups(q, optim::AdagradOptions(0.5)), optim::AdagradOptions(0.7));
  load_optimizer_state(target, state);
  const auto& first = static_cast<const optim::AdagradOptions&>(target.param_groups()[0].options());
  EXPECT_EQ(first.lr(), 0.1);
  EXPECT_EQ(first.lr_decay(), 0.01);
  EXPECT_EQ(get_group_option(target, 1, "lr"), 0.05);

  // A tuple option stays a tuple.
  TinyMomentum tiny(one_group(p), TinyOptions(0.1));
  train_steps(tiny, p, 0, 1);
  State tiny_state = save_optimizer_state(tiny);
  EXPECT_THAT(tiny_state.values["type"].get<std::string>(), HasSubstr("TinyMomentum"));
  EXPECT_EQ(tiny_state.values["groups"][0]["options"]["betas"], nlohmann::json::parse(R"({"__tuple__": [0.8, 1.0]})"));
  EXPECT_EQ(tiny_state.values["params"]["0.2"]["step"], 1);
  ASSERT_TRUE(tiny_state.tensors.count("0.2.velocity"));
  EXPECT_EQ(tiny_state.tensors.size(), 3u);
}

TEST(OptimizerStateTest, OtherTypesMismatchesAreNamedBeforeAnythingChanges) {
  Params p = Params::make(6);
  optim::Adagrad source(two_groups(p, optim::AdagradOptions(0.05)), optim::AdagradOptions(0.1));
  train_steps(source, p, 0, 1);
  State state = save_optimizer_state(source);

  optim::SGD sgd(p.all(), optim::SGDOptions(0.1));
  EXPECT_THAT(load_error(sgd, state), HasSubstr("the checkpoint holds Adagrad state but the optimizer is SGD"));

  Params transposed = p.clone();
  transposed.first[0] = torch::randn({4, 3}).requires_grad_();
  optim::Adagrad wrong_shape(two_groups(transposed, optim::AdagradOptions(0.05)), optim::AdagradOptions(0.7));
  std::vector<ParamGroupInfo> names(2);
  names[0].param_names = {"fc.weight", "fc.bias"};
  names[1].param_names = {"head.weight"};
  EXPECT_THAT(load_error(wrong_shape, state, &names),
              HasSubstr("group 0, parameter 0 (fc.weight): 'sum' has shape [3, 4] in the checkpoint but the "
                        "parameter has shape [4, 3]"));
  // Its own state (Adagrad makes it in its constructor) and options are untouched.
  EXPECT_EQ(wrong_shape.state().size(), 3u);
  EXPECT_EQ(get_group_option(wrong_shape, 0, "lr"), 0.7);

  State orphan = state;
  orphan.tensors["1.5.sum"] = torch::zeros({2, 2});
  EXPECT_THAT(load_error(sgd, orphan), HasSubstr("Adagrad state but the optimizer is SGD"));
  optim::Adagrad target(two_groups(p, optim::AdagradOptions(0.05)), optim::AdagradOptions(0.1));
  EXPECT_THAT(load_error(target, orphan),
              HasSubstr("a tensor '1.5.sum' that is no buffer of a parameter with Adagrad state"));
}

TEST(OptimizerStateTest, ATypeWithoutLoadIsToldHowToAddIt) {
  Params p = Params::make(7);
  TinyMomentumBase<TinyParamState> source(one_group(p), TinyOptions(0.1));
  train_steps(source, p, 0, 2);
  State state = save_optimizer_state(source);  // its ParamState's serialize() is enough to save

  Params q = p.clone();
  TinyMomentumBase<TinyParamState> target(one_group(q), TinyOptions(0.5));
  train_steps(target, q, 0, 1);
  auto state_of_first = [&]() -> const TinyParamState& {
    const auto& param = target.param_groups()[0].params()[0];
    return static_cast<const TinyParamState&>(*target.state().at(compat::param_state_key(target.state(), param)));
  };
  const torch::Tensor velocity = state_of_first().velocity().clone();
  const std::string message = load_error(target, state);
  EXPECT_THAT(message, HasSubstr("TinyMomentumBase"));
  EXPECT_THAT(message, HasSubstr("does not implement load()"));
  EXPECT_THAT(message, HasSubstr("_TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG"));
  // Its own state and options are as they were.
  ASSERT_EQ(target.state().size(), 3u);
  EXPECT_EQ(state_of_first().step(), 1);
  EXPECT_TRUE(torch::equal(state_of_first().velocity(), velocity));
  EXPECT_EQ(get_group_option(target, 0, "lr"), 0.5);
}

TEST(OptimizerStateTest, StateThatCannotBeSeenOrHeldIsRefusedWhenSaving) {
  Params p = Params::make(8);
  TinyMomentumBase<TinyBareParamState> bare(one_group(p), TinyOptions(0.1));
  train_steps(bare, p, 0, 1);
  EXPECT_THAT([&] { save_optimizer_state(bare); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("TinyBareParamState"),
                                                    HasSubstr("serialising the state of group 0, parameter 0"),
                                                    HasSubstr("has not been implemented"))));
  EXPECT_THAT([&] { optimizer_state_bytes(bare); },
              ::testing::ThrowsMessage<Error>(HasSubstr("counting the bytes of group 0, parameter 0")));

  // LBFGS keeps flat buffers and a history list, which no position can hold.
  optim::LBFGS lbfgs(p.all(), optim::LBFGSOptions(0.1).max_iter(2));
  lbfgs.step([&] {
    lbfgs.zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (const auto& t : p.all()) loss = loss + (t * t).sum();
    loss.backward();
    return loss;
  });
  EXPECT_THAT([&] { save_optimizer_state(lbfgs); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("optimizer state of LBFGS: group 0, parameter 0: '"),
                                                    HasSubstr("lockstep stores tensors of the parameter's shape"))));
}

TEST(OptimizerStateTest, StateBytesAddUpTheBuffers) {
  Params p = Params::make(9);
  const int64_t floats = 4 * (12 + 4 + 4);  // bytes of one buffer per parameter
  optim::Adam adam(p.all(), optim::AdamOptions(1e-2).amsgrad(true));
  EXPECT_EQ(optimizer_state_bytes(adam), 0);
  train_steps(adam, p, 0, 1);
  EXPECT_EQ(optimizer_state_bytes(adam), 3 * floats);  // exp_avg, exp_avg_sq, max_exp_avg_sq
  optim::SGD sgd(p.all(), optim::SGDOptions(0.1).momentum(0.9));
  train_steps(sgd, p, 0, 1);
  EXPECT_EQ(optimizer_state_bytes(sgd), floats);
  optim::Adagrad adagrad(p.all(), optim::AdagradOptions(0.1));
  EXPECT_EQ(optimizer_state_bytes(adagrad), floats);  // made in its constructor; the step is no tensor
  TinyMomentum tiny(one_group(p), TinyOptions(0.1));
  EXPECT_EQ(optimizer_state_bytes(tiny), 0);
  train_steps(tiny, p, 0, 1);
  EXPECT_EQ(optimizer_state_bytes(tiny), floats);
}

}  // namespace
}  // namespace lockstep
