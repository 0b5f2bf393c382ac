// lockstep::checkpoint: the same gradients (bitwise) as without it, dropout
// included, with the random state left where an uncheckpointed run leaves
// it; switching modules on by type, and refusing modules that cannot.
#include "lockstep/model/activation_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 12));
    fc2 = register_module("fc2", torch::nn::Linear(12, 6));
    drop = register_module("drop", torch::nn::Dropout(0.3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return checkpointed(*this, [this](const torch::Tensor& h) {
      ++runs;
      return h + drop(fc2(torch::gelu(drop(fc1(h)))));
    }, x);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
  int runs = 0;
};
TORCH_MODULE(Block);

struct LegacyImpl : torch::nn::Module {  // a module that does not support checkpointing
  LegacyImpl() { fc = register_module("fc", torch::nn::Linear(6, 6)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Legacy);

struct Net : torch::nn::Module {
  Net() {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block()));
    legacy = register_module("legacy", Legacy());
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block(x);
    return legacy(x);
  }
  std::vector<Block> blocks;
  Legacy legacy{nullptr};
};

struct Gradients {
  std::map<std::string, torch::Tensor> params;
  torch::Tensor input, after;  // the input's gradient; a draw after backward
};

Gradients run(bool checkpointing) {
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  if (checkpointing) apply_activation_checkpointing(*net, {"Block"});
  torch::Tensor x = torch::randn({5, 6}, torch::requires_grad());
  torch::manual_seed(11);  // the dropout masks
  net->forward(x).pow(2).sum().backward();
  Gradients result;
  for (const auto& item : net->named_parameters()) result.params[item.key()] = item.value().grad().clone();
  result.input = x.grad().clone();
  result.after = torch::rand({4});
  if (checkpointing) {
    for (const auto& block : net->blocks) EXPECT_EQ(block->runs, 2);  // forward, then again in backward
  }
  return result;
}

TEST(ActivationCheckpoint, GradientsAndRandomStateEqualThoseWithoutIt) {
  const Gradients plain = run(false), checkpointed = run(true);
  ASSERT_EQ(plain.params.size(), checkpointed.params.size());
  for (const auto& [name, grad] : plain.params) {
    EXPECT_TRUE(torch::equal(grad, checkpointed.params.at(name))) << name;
  }
  EXPECT_TRUE(torch::equal(plain.input, checkpointed.input));
  EXPECT_TRUE(torch::equal(plain.after, checkpointed.after)) << "the recomputation must leave the generator as it found it";
}

TEST(ActivationCheckpoint, KeepsNoActivationsInsideTheFunction) {
  // A graph with checkpointing holds the checkpoint node only: the function's
  // intermediate results are freed after forward.
  torch::Tensor x = torch::randn({1000, 100}, torch::requires_grad());
  c10::weak_intrusive_ptr<c10::TensorImpl> middle{c10::intrusive_ptr<c10::TensorImpl>()};
  int runs = 0;
  auto fn = [&](const torch::Tensor& h) {
    torch::Tensor hidden = torch::tanh(h) * 3;  // an activation an ordinary graph would keep
    if (runs++ == 0) middle = c10::weak_intrusive_ptr<c10::TensorImpl>(hidden.getIntrusivePtr());
    return hidden.sum(1);
  };
  torch::Tensor y = checkpoint(fn, x);
  EXPECT_TRUE(middle.expired()) << "the forward's activation outlived it";
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "lockstep::CheckpointBackward");
  y.sum().backward();
  EXPECT_EQ(runs, 2);
  const torch::Tensor expected = 3 * (1 - torch::tanh(x.detach()).pow(2));
  EXPECT_TRUE(torch::allclose(x.grad(), expected, 1e-5, 1e-6)) << (x.grad() / expected).flatten().slice(0, 0, 5);
}

TEST(ActivationCheckpoint, GradientsReachTheirOutputsPastNonDifferentiableOnes) {
  // An integer output first, then two floating ones: each incoming gradient
  // belongs to its own output.
  torch::Tensor x = torch::randn({4, 3}, torch::requires_grad());
  auto outputs = checkpoint(
      [](const std::vector<torch::Tensor>& in) {
        return std::vector<torch::Tensor>{in[0].argmax(1), in[0] * 2, in[0].pow(2)};
      },
      {x});
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_FALSE(outputs[0].requires_grad());
  (outputs[1].sum() * 5 + outputs[2].sum()).backward();
  EXPECT_TRUE(torch::allclose(x.grad(), 10 + 2 * x.detach()));
}

TEST(ActivationCheckpoint, AnInputModifiedInPlaceAfterForwardIsAnError) {
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  torch::Tensor h = x * 1;  // a non-leaf the caller may modify
  torch::Tensor y = checkpoint([](const torch::Tensor& t) { return t.exp(); }, h);
  { torch::NoGradGuard no_grad; h.add_(1); }
  try {
    y.sum().backward();
    ADD_FAILURE() << "backward ran on a modified input";
  } catch (const std::exception& error) {
    EXPECT_THAT(error.what(), ::testing::HasSubstr("modified in place after the forward"));
  }
}

TEST(ActivationCheckpoint, WithoutGradModeTheFunctionJustRuns) {
  torch::NoGradGuard no_grad;
  int runs = 0;
  torch::Tensor y = checkpoint([&](const torch::Tensor& h) { ++runs; return h * 2; }, torch::ones({2}));
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(y.requires_grad());
}

TEST(ActivationCheckpoint, ModulesAreChosenByTypeAndMustSupportIt) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(apply_activation_checkpointing(*net, {"Block"}),
            (std::vector<std::string>{"block0", "block1", "block2"}));
  auto other = std::make_shared<Net>();
  try {
    apply_activation_checkpointing(*other, {"Attention"});
    ADD_FAILURE() << "no module matches";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), ::testing::HasSubstr("no module of type Attention"));
  }
  apply_activation_checkpointing(*other, {"Legacy", "Block"});
  other->forward(torch::randn({2, 6}, torch::requires_grad())).sum().backward();
  EXPECT_EQ(unconsulted_checkpoint_modules(*other), (std::vector<std::string>{"legacy"}));
  EXPECT_TRUE(module_type_matches("lockstep::(anonymous namespace)::BlockImpl", "Block"));
  EXPECT_FALSE(module_type_matches("lockstep::SubBlockImpl", "Block"));
}

}  // namespace
}  // namespace lockstep
