// AmpOptimWrapper: a hand-written mixed-precision loop as the reference for
// accumulation + loss scaling + clipping, skipped steps, configs, state.
#include "lockstep/amp/amp_optim_wrapper.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/amp/autocast.h"
#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/model/batch.h"
#include "lockstep/builtin_models/classifiers.h"
#include "lockstep/optim/optim_wrapper_builder.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

constexpr auto kCpu = c10::DeviceType::CPU;

std::shared_ptr<MLP> make_mlp() {
  torch::manual_seed(11);
  return std::make_shared<MLP>(MLPOptions().in_features(12).hidden({16}).num_classes(4));
}

Batch make_batch(int64_t step) {
  torch::manual_seed(100 + step);
  return Batch{{"image", torch::randn({6, 12})}, {"label", torch::randint(0, 4, {6}, torch::kLong)}};
}

std::shared_ptr<torch::optim::SGD> make_sgd(torch::nn::Module& model) {
  return std::make_shared<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
}

ClipGradOptions clip_norm(double max_norm) {
  ClipGradOptions clip;
  clip.kind = ClipGradOptions::Kind::kNorm;
  clip.max_norm = max_norm;
  return clip;
}

TEST(AmpOptimWrapper, AccumulationScalingAndClippingMatchAHandWrittenLoop) {
  const int64_t accumulation = 3;
  const int64_t updates = 3;
  const double max_norm = 0.05;
  auto model = make_mlp();
  AmpOptimWrapper optim(make_sgd(*model), OptimWrapperOptions().accumulative_counts(accumulation).clip_grad(clip_norm(max_norm)),
                        AmpOptions().dtype(torch::kBFloat16).loss_scale(GradScalerOptions().init_scale(1024).growth_interval(2)));
  optim.initialize_count_status(0, accumulation * updates);

  // The reference: autocast forward, (loss / 3 * scale).backward() per
  // micro-step, then once per window: divide by the scale, clip to max_norm,
  // step, and double the scale after every 2 clean updates.
  auto reference = make_mlp();
  auto reference_sgd = make_sgd(*reference);
  float scale = 1024;
  int clean_in_a_row = 0;
  int clipped = 0;
  for (int64_t update = 0; update < updates; ++update) {
    double reference_norm = 0;
    reference_sgd->zero_grad();
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      Batch batch = make_batch(update * accumulation + micro);
      model->train_step(batch, optim);
      torch::Tensor loss;
      {
        AutocastGuard autocast(kCpu, torch::kBFloat16);
        loss = torch::nn::functional::cross_entropy(reference->forward(batch.at("image")), batch.at("label"));
      }
      ((loss / 3.0) * scale).backward();
    }
    {
      torch::NoGradGuard no_grad;
      double sum_squares = 0;
      for (auto& p : reference->parameters()) {
        p.mutable_grad().mul_(1.0f / scale);
        sum_squares += p.grad().to(torch::kDouble).norm().pow(2).item<double>();
      }
      reference_norm = std::sqrt(sum_squares);
      const double coefficient = max_norm / (reference_norm + 1e-6);
      if (coefficient < 1.0) {
        clipped += 1;
        for (auto& p : reference->parameters()) p.mutable_grad().mul_(coefficient);
      }
    }
    reference_sgd->step();
    LogVars metrics = optim.last_update_metrics();
    EXPECT_EQ(metrics.at("loss_scale"), scale) << "update " << update;
    // The norm clipping saw is the true one: unscaled once, not 0 or 1024 times.
    EXPECT_NEAR(metrics.at("grad_norm"), reference_norm, 1e-5 * reference_norm) << "update " << update;
    if (++clean_in_a_row == 2) {
      scale *= 2;
      clean_in_a_row = 0;
    }
  }
  ASSERT_GT(clipped, 0) << "max_norm too large: the test would not exercise clipping";
  EXPECT_EQ(optim.grad_scaler()->get_scale(), 2048.0);
  auto ours = model->named_parameters();
  for (const auto& item : reference->named_parameters()) {
    const torch::Tensor& mine = ours[item.key()];
    EXPECT_TRUE(torch::allclose(mine, item.value(), 1e-5, 1e-7))
        << item.key() << ": max |diff| " << (mine - item.value()).abs().max().item<double>();
  }
}

TEST(AmpOptimWrapper, Bf16RunsTheForwardInBfloat16WithoutAScaler) {
  auto model = make_mlp();
  AmpOptimWrapper optim(make_sgd(*model), OptimWrapperOptions(), AmpOptions().dtype(torch::kBFloat16));
  EXPECT_EQ(optim.grad_scaler(), nullptr);
  EXPECT_EQ(optim.device_type(), kCpu);
  Batch batch = make_batch(0);
  torch::Tensor logits, loss;
  {
    auto context = optim.optim_context();
    logits = model->forward(batch.at("image"));
    loss = torch::nn::functional::cross_entropy(logits, batch.at("label"));
  }
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_FALSE(autocast_enabled(kCpu)) << "the context left autocast on";
  torch::Tensor before = model->parameters().front().detach().clone();
  optim.update_params(loss);
  EXPECT_FALSE(torch::equal(before, model->parameters().front().detach()));
  // Gradients of float32 parameters stay float32.
  EXPECT_EQ(optim.last_update_metrics().count("loss_scale"), 0u);
  // A forward that throws still closes the region.
  EXPECT_THROW(
      {
        auto context = optim.optim_context();
        throw Error("forward failed");
      },
      Error);
  EXPECT_FALSE(autocast_enabled(kCpu));
}

TEST(AmpOptimWrapper, InjectedInfSkipsTheUpdateAndHalvesTheScale) {
  auto model = make_mlp();
  AmpOptimWrapper optim(make_sgd(*model), OptimWrapperOptions(),
                        AmpOptions().dtype(torch::kBFloat16).loss_scale(GradScalerOptions()));
  int64_t step = 0;
  const StepContext inject{-1, [&] {
    if (step == 1) model->parameters().back().mutable_grad()[0] = INFINITY;
  }};
  std::vector<double> scales;
  for (step = 0; step < 3; ++step) {
    torch::Tensor before = torch::cat({model->parameters().front().detach().flatten().clone()});
    model->run_train_step(make_batch(step), optim, inject);
    const bool changed = !torch::equal(before, model->parameters().front().detach().flatten());
    EXPECT_EQ(changed, step != 1) << "step " << step;
    scales.push_back(optim.last_update_metrics().at("loss_scale"));
    for (auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "gradients survive the update";
  }
  EXPECT_EQ(scales, (std::vector<double>{65536, 65536, 32768}));
}

TEST(AmpOptimWrapper, ScalerStateTravelsWithTheOptimizerState) {
  auto model = make_mlp();
  auto options = AmpOptions().dtype(torch::kBFloat16).loss_scale(GradScalerOptions().init_scale(64).growth_interval(1));
  AmpOptimWrapper optim(make_sgd(*model), OptimWrapperOptions(), options);
  for (int64_t step = 0; step < 3; ++step) model->train_step(make_batch(step), optim);
  ASSERT_EQ(optim.grad_scaler()->get_scale(), 512.0);
  State state = optim.state();
  ASSERT_TRUE(state.contains("grad_scaler"));

  auto other = make_mlp();
  AmpOptimWrapper resumed(make_sgd(*other), OptimWrapperOptions(), options);
  resumed.load_state(state);
  EXPECT_EQ(resumed.grad_scaler()->get_scale(), 512.0);
  // A checkpoint of a run without loss scaling: the scale starts over.
  AmpOptimWrapper plain(make_sgd(*other), OptimWrapperOptions(), AmpOptions().dtype(torch::kBFloat16));
  State without = plain.state();
  EXPECT_FALSE(without.contains("grad_scaler"));
  AmpOptimWrapper fresh(make_sgd(*other), OptimWrapperOptions(), options);
  fresh.load_state(without);
  EXPECT_EQ(fresh.grad_scaler()->get_scale(), 64.0);
}

std::shared_ptr<AmpOptimWrapper> build_from(const std::string& yaml, torch::nn::Module& model) {
  Config config = parse_config(yaml, "amp.yaml");
  return std::dynamic_pointer_cast<AmpOptimWrapper>(build_optim_wrapper(config.at("optim_wrapper"), model));
}

// Building `yaml` fails with an error that contains `needle`.
void expect_build_error(const std::string& yaml, torch::nn::Module& model, const std::string& needle) {
  const std::string message = testing::error_of([&] { build_from(yaml, model); });
  EXPECT_NE(message.find(needle), std::string::npos) << yaml << ": " << message;
}

// `yaml` builds a bf16 wrapper without a loss scaler: bf16 needs none unless asked.
void expect_bf16_without_scaler(const std::string& yaml, torch::nn::Module& model) {
  auto bf16 = build_from(yaml, model);
  ASSERT_NE(bf16, nullptr) << yaml;
  EXPECT_EQ(bf16->dtype(), torch::kBFloat16) << yaml;
  EXPECT_EQ(bf16->grad_scaler(), nullptr) << yaml;
}

TEST(AmpOptimWrapper, BuildsFromConfig) {
  auto model = make_mlp();
  const std::string head = "optim_wrapper:\n  type: AmpOptimWrapper\n  optimizer: {type: SGD, lr: 0.1}\n";
  expect_bf16_without_scaler(head + "  dtype: bf16\n", *model);
  auto dynamic = build_from(head + "  dtype: bfloat16\n  loss_scale: dynamic\n  device: cpu\n", *model);
  ASSERT_NE(dynamic->grad_scaler(), nullptr);
  EXPECT_TRUE(dynamic->grad_scaler()->options().dynamic());
  EXPECT_EQ(dynamic->grad_scaler()->get_scale(), 65536.0);
  auto fixed = build_from(head + "  dtype: bf16\n  loss_scale: 128\n", *model);
  EXPECT_FALSE(fixed->grad_scaler()->options().dynamic());
  EXPECT_EQ(fixed->grad_scaler()->get_scale(), 128.0);
  auto custom = build_from(head + "  loss_scale: {init_scale: 256, growth_interval: 5}\n", *model);
  EXPECT_EQ(custom->dtype(), torch::kBFloat16) << "cpu's default";
  EXPECT_EQ(custom->grad_scaler()->options().growth_interval(), 5);

  auto expect_error = [&](const std::string& extra, const std::string& needle) {
    expect_build_error(head + extra, *model, needle);
  };
  expect_error("  dtype: fp16\n", "amp.yaml:4 (key optim_wrapper.dtype)");
  expect_error("  dtype: fp8\n", "optim_wrapper.dtype");
  expect_error("  dtype: bf16\n  device: tpu\n", "optim_wrapper.device");
  expect_error("  dtype: bf16\n  loss_scal: dynamic\n", "loss_scal");
  expect_error("  dtype: bf16\n  loss_scale: {init_scale: 8, growth_intervl: 3}\n", "growth_intervl");
}

TEST(AmpOptimWrapper, BuildsFromAnAmpSwitchOnThePlainWrapper) {
  auto model = make_mlp();
  // `type: OptimWrapper` as a base config would name it: amp upgrades it.
  const std::string head = "optim_wrapper:\n  type: OptimWrapper\n  optimizer: {type: SGD, lr: 0.1}\n";
  expect_bf16_without_scaler(head + "  amp: {dtype: bf16}\n", *model);
  auto scaled = build_from("optim_wrapper:\n  optimizer: {type: SGD, lr: 0.1}\n  amp: {dtype: bf16, loss_scale: 512}\n",
                           *model);
  ASSERT_NE(scaled->grad_scaler(), nullptr);
  EXPECT_FALSE(scaled->grad_scaler()->options().dynamic());
  EXPECT_EQ(scaled->grad_scaler()->get_scale(), 512.0);
  auto defaults = build_from(head + "  amp: true\n", *model);
  ASSERT_NE(defaults, nullptr);
  EXPECT_EQ(defaults->dtype(), torch::kBFloat16) << "cpu's default";
  Config off = parse_config(head + "  amp: false\n", "amp.yaml");
  auto plain = build_optim_wrapper(off.at("optim_wrapper"), *model);
  EXPECT_EQ(std::dynamic_pointer_cast<AmpOptimWrapper>(plain), nullptr);
  EXPECT_NE(std::dynamic_pointer_cast<OptimWrapper>(plain), nullptr);

  auto expect_error = [&](const std::string& extra, const std::string& needle) {
    expect_build_error(head + extra, *model, needle);
  };
  expect_error("  amp: {dtype: fp16}\n", "optim_wrapper.amp.dtype");
  expect_error("  amp: {dtype: bf16, loss_scal: dynamic}\n", "loss_scal");
  expect_error("  dtype: bf16\n  amp: {loss_scale: dynamic}\n", "inside optim_wrapper.amp");
}

TEST(AmpOptimWrapper, CudaFloat16WithDynamicScalingTrains) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto model = make_mlp();
  model->move_to(torch::kCUDA);
  AmpOptimWrapper optim(make_sgd(*model));
  EXPECT_EQ(optim.dtype(), torch::kHalf);
  ASSERT_NE(optim.grad_scaler(), nullptr);
  double first = 0, last = 0;
  for (int64_t step = 0; step < 50; ++step) {
    LogVars vars = model->train_step(make_batch(step % 2), optim);
    (step == 0 ? first : last) = vars.at("loss");
  }
  EXPECT_LT(last, first);
  EXPECT_EQ(optim.last_update_metrics().at("loss_scale"), 65536.0);
}

// optim/ names no mixed-precision type: `amp` is a switch amp/ registers.
TEST(OptimWrapperSwitch, AmpTurnsThePlainWrapperIntoItsTypeAndFalseLeavesItPlain) {
  torch::nn::Linear model(2, 1);
  auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  auto mixed = wrap_optimizer(parse_config("amp: {dtype: bf16}\n", "w.yaml"), sgd);
  EXPECT_NE(dynamic_cast<AmpOptimWrapper*>(mixed.get()), nullptr);
  auto plain = wrap_optimizer(parse_config("amp: false\n", "w.yaml"), sgd);
  EXPECT_EQ(dynamic_cast<AmpOptimWrapper*>(plain.get()), nullptr);
}

}  // namespace
}  // namespace lockstep
