// AutocastGuard: which ops run in which precision on CPU, nesting, the cast
// cache, and the CUDA dtypes where a GPU is present.
#include "lockstep/amp/autocast.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/compat/autocast.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

constexpr auto kAutocastCpu = c10::DeviceType::CPU;

TEST(Autocast, CpuRunsMatmulAndConvInBfloat16) {
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({8, 32});
  torch::Tensor w = torch::randn({32, 16});
  torch::Tensor image = torch::randn({2, 3, 10, 10});
  torch::Tensor kernel = torch::randn({4, 3, 3, 3});
  torch::Tensor product, conv, plain;
  {
    AutocastGuard autocast(kAutocastCpu, torch::kBFloat16);
    product = torch::matmul(x, w);
    conv = torch::conv2d(image, kernel);
  }
  plain = torch::matmul(x, w);
  EXPECT_EQ(product.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(conv.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(plain.scalar_type(), torch::kFloat) << "autocast leaked out of the guard";
  // The same ops on inputs rounded to bfloat16 by hand: autocast really cast
  // them (the float32 result differs in the low bits).
  EXPECT_TRUE(torch::equal(product, torch::matmul(x.to(torch::kBFloat16), w.to(torch::kBFloat16))));
  EXPECT_TRUE(torch::equal(conv, torch::conv2d(image.to(torch::kBFloat16), kernel.to(torch::kBFloat16))));
  EXPECT_FALSE(torch::equal(product.to(torch::kFloat), plain));
}

TEST(Autocast, CpuKeepsReductionsAndLossesInFloat32) {
  torch::manual_seed(1);
  torch::Tensor x = torch::randn({8, 5});
  torch::Tensor w = torch::randn({5, 5});
  torch::Tensor labels = torch::randint(0, 5, {8}, torch::kLong);
  AutocastGuard autocast(kAutocastCpu, torch::kBFloat16);
  // Float32 inputs are not lowered by reductions (only by the matmul family).
  EXPECT_EQ(x.sum().scalar_type(), torch::kFloat);
  EXPECT_EQ(x.mean().scalar_type(), torch::kFloat);
  EXPECT_EQ(torch::softmax(x, 1).scalar_type(), torch::kFloat);
  EXPECT_EQ(torch::log_softmax(x, 1).scalar_type(), torch::kFloat);
  // Losses of bfloat16 logits are computed in float32.
  torch::Tensor logits = torch::matmul(x, w);
  ASSERT_EQ(logits.scalar_type(), torch::kBFloat16);
  torch::Tensor ce = torch::nn::functional::cross_entropy(logits, labels);
  EXPECT_EQ(ce.scalar_type(), torch::kFloat);
  EXPECT_EQ(torch::nll_loss(torch::log_softmax(logits.to(torch::kFloat), 1), labels).scalar_type(), torch::kFloat);
  EXPECT_EQ(torch::mse_loss(logits, torch::zeros_like(logits)).scalar_type(), torch::kFloat);
  // cross_entropy computed in float32 from the bfloat16 logits' values.
  torch::Tensor expected = -torch::log_softmax(logits.to(torch::kFloat), 1).gather(1, labels.unsqueeze(1)).mean();
  EXPECT_NEAR(ce.item<double>(), expected.item<double>(), 1e-6);
  // A mix of bfloat16 and float32 promotes to float32.
  EXPECT_EQ((logits + x).scalar_type(), torch::kFloat);
}

TEST(Autocast, NestingRestoresEnabledFlagAndDtype) {
  // (libtorch 1.13 accepts no other CPU dtype than bfloat16, so dtype
  // restoring is checked on CUDA below.)
  ASSERT_FALSE(autocast_enabled(kAutocastCpu));
  torch::Tensor x = torch::randn({4, 4});
  {
    AutocastGuard outer(kAutocastCpu, torch::kBFloat16);
    EXPECT_TRUE(autocast_enabled(kAutocastCpu));
    EXPECT_EQ(autocast_dtype(kAutocastCpu), torch::kBFloat16);
    {
      AutocastGuard full_precision(kAutocastCpu, torch::kBFloat16, /*enabled=*/false);
      EXPECT_FALSE(autocast_enabled(kAutocastCpu));
      EXPECT_EQ(torch::mm(x, x).scalar_type(), torch::kFloat);
      {
        AutocastGuard inner(kAutocastCpu, torch::kBFloat16);
        EXPECT_EQ(torch::mm(x, x).scalar_type(), torch::kBFloat16);
      }
      EXPECT_FALSE(autocast_enabled(kAutocastCpu));
    }
    EXPECT_TRUE(autocast_enabled(kAutocastCpu));
    EXPECT_EQ(autocast_dtype(kAutocastCpu), torch::kBFloat16);
    EXPECT_EQ(torch::mm(x, x).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(autocast_enabled(kAutocastCpu));
  // Every guard gave its nesting level back: the next region is outermost.
  EXPECT_EQ(compat::increment_autocast_nesting(), 1);
  EXPECT_EQ(compat::decrement_autocast_nesting(), 0);
}

TEST(Autocast, OutermostExitClearsTheWeightCastCache) {
  // Autocast casts a float32 leaf that requires grad (a weight) once per
  // region and reuses the copy: inside one region an in-place update of the
  // weight is not seen, after the outermost exit it must be.
  torch::Tensor weight = torch::ones({8, 3}, torch::requires_grad());
  torch::Tensor x = torch::ones({1, 8});
  auto update_weight = [&] {
    torch::NoGradGuard no_grad;
    weight.add_(1.0);
  };
  {
    AutocastGuard outer(kAutocastCpu, torch::kBFloat16);
    EXPECT_EQ(torch::mm(x, weight)[0][0].item<double>(), 8.0);
    {
      AutocastGuard inner(kAutocastCpu, torch::kBFloat16);
    }
    update_weight();
    // An inner exit keeps the cache (as torch.autocast): still the old copy.
    EXPECT_EQ(torch::mm(x, weight)[0][0].item<double>(), 8.0);
  }
  AutocastGuard next(kAutocastCpu, torch::kBFloat16);
  EXPECT_EQ(torch::mm(x, weight)[0][0].item<double>(), 16.0) << "a stale cast of the weight survived the region";
}

TEST(Autocast, RejectsUnsupportedDtypesAndDevices) {
  EXPECT_THROW((AutocastGuard{kAutocastCpu, torch::kHalf}), Error);
  EXPECT_THROW((AutocastGuard{kAutocastCpu, torch::kFloat}), Error);
  EXPECT_THROW((AutocastGuard{c10::DeviceType::CUDA, torch::kDouble}), Error);
  EXPECT_THROW(check_autocast_supported(c10::DeviceType::XLA, torch::kBFloat16), Error);
  try {
    check_autocast_supported(kAutocastCpu, torch::kHalf, "cfg.yaml:3 (key optim_wrapper.dtype)");
    FAIL() << "fp16 on cpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optim_wrapper.dtype"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(autocast_enabled(kAutocastCpu)) << "a rejected guard left autocast on";
}

TEST(Autocast, CudaRunsMatmulInFloat16AndBfloat16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::Tensor x = torch::randn({8, 8}, torch::kCUDA);
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    AutocastGuard autocast(c10::DeviceType::CUDA, dtype);
    EXPECT_EQ(torch::mm(x, x).scalar_type(), dtype);
    // CUDA autocast lists softmax and sum as float32 ops.
    EXPECT_EQ(torch::softmax(torch::mm(x, x), 1).scalar_type(), torch::kFloat);
    EXPECT_FALSE(autocast_enabled(kAutocastCpu));
  }
  EXPECT_FALSE(autocast_enabled(c10::DeviceType::CUDA));
  // An inner guard with another dtype hands the outer one's back.
  AutocastGuard outer(c10::DeviceType::CUDA, torch::kHalf);
  {
    AutocastGuard inner(c10::DeviceType::CUDA, torch::kBFloat16);
    EXPECT_EQ(torch::mm(x, x).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(autocast_dtype(c10::DeviceType::CUDA), torch::kHalf);
  EXPECT_EQ(torch::mm(x, x).scalar_type(), torch::kHalf);
}

}  // namespace
}  // namespace lockstep
