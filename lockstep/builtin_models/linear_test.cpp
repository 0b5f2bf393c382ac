#include "lockstep/builtin_models/linear.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "lockstep/amp/autocast.h"

namespace lockstep {
namespace {

// The order in which the parameters' gradients are computed in one backward
// of a two-layer net under CPU bf16 autocast (the order DDP's reducer sees).
template <typename Layer>
std::vector<std::string> gradient_order_under_bf16() {
  torch::manual_seed(0);
  torch::nn::Sequential net(Layer(12, 8), torch::nn::ReLU(), Layer(8, 4));
  std::vector<std::string> order;
  for (const auto& item : net->named_parameters()) {
    const std::string name = item.key();
    item.value().register_hook([&order, name](torch::Tensor grad) {
      order.push_back(name);
      return grad;
    });
  }
  const torch::Tensor input = torch::randn({6, 12}, torch::requires_grad());
  torch::Tensor loss;
  {
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    loss = net->forward(input).sum();
  }
  loss.backward();
  return order;
}

TEST(Linear, GradientsReadyWeightBeforeBiasUnderAutocastAsPythonsNnLinear) {
  // Python's nn.Linear (at::linear) under CPU bf16 autocast, libtorch 1.13:
  // head.3.weight, head.3.bias, head.1.weight, head.1.bias (Note [Linear as
  // Python's nn.Linear]); torch::nn::Linear gives each bias first.
  EXPECT_EQ(gradient_order_under_bf16<Linear>(),
            (std::vector<std::string>{"2.weight", "2.bias", "0.weight", "0.bias"}));
  EXPECT_EQ(gradient_order_under_bf16<torch::nn::Linear>(),
            (std::vector<std::string>{"2.bias", "2.weight", "0.bias", "0.weight"}))
      << "libtorch's C++ Linear no longer differs from Python's: Note [Linear as Python's nn.Linear] is out of date";
}

TEST(Linear, ComputesTheSameBitsAsTorchLinearInFloat32) {
  torch::manual_seed(1);
  Linear ours(torch::nn::LinearOptions(12, 5));
  torch::nn::Linear theirs(torch::nn::LinearOptions(12, 5));
  {
    torch::NoGradGuard no_grad;
    theirs->weight.copy_(ours->weight);
    theirs->bias.copy_(ours->bias);
  }
  const torch::Tensor input = torch::randn({7, 12});
  const torch::Tensor ours_out = ours(input);
  const torch::Tensor theirs_out = theirs(input);
  EXPECT_TRUE(torch::equal(ours_out, theirs_out));
  ours_out.square().sum().backward();
  theirs_out.square().sum().backward();
  EXPECT_TRUE(torch::equal(ours->weight.grad(), theirs->weight.grad()));
  EXPECT_TRUE(torch::equal(ours->bias.grad(), theirs->bias.grad()));
}

TEST(Linear, IsFoundAsATorchLinearAndPrintsItsOwnName) {
  torch::nn::Sequential net(Linear(3, 2));
  auto* found = net[0]->as<torch::nn::Linear>();
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->options.out_features(), 2);
  std::ostringstream printed;
  net[0]->pretty_print(printed);
  EXPECT_EQ(printed.str(), "lockstep::Linear(in_features=3, out_features=2, bias=true)");
}

TEST(Linear, ACloneIsALockstepLinearWithCopiedValuesAndMode) {
  torch::nn::Sequential net(Linear(4, 3), torch::nn::ReLU(), Linear(torch::nn::LinearOptions(3, 2).bias(false)));
  net->eval();
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
  ASSERT_NE(copy, nullptr);
  for (size_t index : {size_t{0}, size_t{2}}) {
    auto* layer = copy->ptr(index)->as<LinearImpl>();
    ASSERT_NE(layer, nullptr) << "layer " << index << " was sliced into a torch::nn::LinearImpl";
    EXPECT_FALSE(layer->is_training());
  }
  const auto originals = net->named_parameters();
  const auto copies = copy->named_parameters();
  ASSERT_EQ(copies.keys(), originals.keys());
  for (const auto& item : originals) {
    const torch::Tensor& copied = copies[item.key()];
    EXPECT_TRUE(torch::equal(copied, item.value())) << item.key();
    EXPECT_NE(copied.data_ptr(), item.value().data_ptr()) << item.key() << " shares storage with the original";
    EXPECT_TRUE(copied.requires_grad()) << item.key();
  }
  EXPECT_FALSE(copy->ptr(2)->as<LinearImpl>()->bias.defined());
}

}  // namespace
}  // namespace lockstep
