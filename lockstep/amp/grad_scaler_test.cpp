// GradScaler against closed forms: the scaled loss, the unscaled gradients,
// skipped steps, the scale's back-off and growth, state round trips, and the
// fused kernels against the portable ones where libtorch has both.
#include "lockstep/amp/grad_scaler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "lockstep/amp/internal/grad_scaler_stage.h"
#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/compat/amp_ops.h"
#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/optim/gradient_sync.h"
#include "tests/support/internal_error_check.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

// One parameter [1, 2, 3] under plain SGD with lr 1: a step subtracts the grad.
struct OneParam {
  torch::Tensor param = torch::tensor({1.0f, 2.0f, 3.0f}).requires_grad_();
  torch::optim::SGD sgd{std::vector<torch::Tensor>{param}, torch::optim::SGDOptions(1.0)};
  // Backward of scale(sum(param * g)): the gradient is g * scale.
  void backward(GradScaler& scaler, const torch::Tensor& g) {
    sgd.zero_grad();
    scaler.scale((param * g).sum()).backward();
  }
};

// A GradientSync that stands for the other ranks: it answers `others_found`
// ORed with the local flag, and counts how often it was asked.
struct FakeRanks : GradientSync {
  bool others_found = false;
  int calls = 0;
  void begin_forward(bool) override {}
  void begin_backward(const torch::Tensor&, bool, int64_t) override {}
  void end_backward(bool) override {}
  torch::Tensor any_rank_true(const torch::Tensor& local) override {
    calls += 1;
    return others_found ? torch::ones_like(local) : local;
  }
};

TEST(GradScaler, ScalesTheLossByTheInitialScale) {
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  torch::Tensor scaled = scaler.scale(torch::tensor(0.75f));
  EXPECT_EQ(scaled.dim(), 0);
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat);
  EXPECT_EQ(scaled.item<double>(), 0.75 * 65536);
  // A bfloat16 loss is scaled in float32 (bfloat16 would round 0.3 * 2^16).
  EXPECT_EQ(scaler.scale(torch::tensor(3.0f).to(torch::kBFloat16)).scalar_type(), torch::kFloat);
}

TEST(GradScaler, UnscaleDividesGradientsAndStepUsesThem) {
  GradScaler scaler;
  OneParam p;
  p.backward(scaler, torch::tensor({0.5f, -0.25f, 3.0f}));
  EXPECT_TRUE(torch::equal(p.param.grad(), torch::tensor({0.5f, -0.25f, 3.0f}) * 65536));
  scaler.unscale_(p.sgd);
  EXPECT_TRUE(torch::equal(p.param.grad(), torch::tensor({0.5f, -0.25f, 3.0f})));
  EXPECT_FALSE(scaler.found_inf(p.sgd));
  EXPECT_TRUE(scaler.step(p.sgd));  // does not unscale a second time
  EXPECT_TRUE(torch::equal(p.param.detach(), torch::tensor({0.5f, 2.25f, 0.0f})));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(GradScaler, InfOrNanGradientSkipsTheStepAndHalvesTheScale) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    GradScaler scaler(GradScalerOptions().growth_interval(3));
    OneParam p;
    p.backward(scaler, torch::tensor({1.0f, 1.0f, 1.0f}));
    EXPECT_TRUE(scaler.step(p.sgd));
    scaler.update();
    ASSERT_EQ(scaler.growth_tracker(), 1);
    torch::Tensor before = p.param.detach().clone();
    p.backward(scaler, torch::tensor({1.0f, bad, 1.0f}));
    EXPECT_FALSE(scaler.step(p.sgd)) << bad;
    EXPECT_TRUE(scaler.found_inf(p.sgd));
    EXPECT_TRUE(torch::equal(p.param.detach(), before)) << "a step with " << bad << " in the gradient was taken";
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_EQ(scaler.growth_tracker(), 0) << "an overflow restarts the count of clean steps";
  }
}

TEST(GradScaler, CleanStepsInARowGrowTheScale) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0).growth_interval(3));
  OneParam p;
  const std::vector<bool> overflow{false, false, true, false, false, false, false, false, false};
  // Closed form: halve on overflow; double after 3 clean steps in a row.
  const std::vector<double> expected_scale{8, 8, 4, 4, 4, 8, 8, 8, 16};
  const std::vector<int64_t> expected_tracker{1, 2, 0, 1, 2, 0, 1, 2, 0};
  for (size_t i = 0; i < overflow.size(); ++i) {
    p.backward(scaler, torch::tensor({1.0f, overflow[i] ? INFINITY : 1.0f, 1.0f}));
    EXPECT_EQ(scaler.step(p.sgd), !overflow[i]) << "step " << i;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), expected_scale[i]) << "step " << i;
    EXPECT_EQ(scaler.growth_tracker(), expected_tracker[i]) << "step " << i;
  }
}

TEST(GradScaler, ScaleStopsGrowingAtTheFloat32Limit) {
  const double top = std::ldexp(1.0, 127);  // 2^128 is inf in float32
  GradScaler scaler(GradScalerOptions().init_scale(top).growth_interval(1));
  OneParam p;
  p.backward(scaler, torch::tensor({0.0f, 0.0f, 0.0f}));
  scaler.step(p.sgd);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), top);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, StaticScaleSkipsOverflowsButKeepsItsValue) {
  GradScaler scaler(GradScalerOptions().init_scale(512).dynamic(false));
  OneParam p;
  for (bool overflow : {false, true, false}) {
    torch::Tensor before = p.param.detach().clone();
    p.backward(scaler, torch::tensor({2.0f, overflow ? NAN : 2.0f, 2.0f}));
    EXPECT_EQ(scaler.step(p.sgd), !overflow);
    EXPECT_EQ(torch::equal(p.param.detach(), before), overflow);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 512.0);
  }
}

TEST(GradScaler, DisabledScalerPassesEverythingThrough) {
  GradScaler scaler(GradScalerOptions().enabled(false));
  OneParam p;
  torch::Tensor loss = (p.param * 2).sum();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.unscale_(p.sgd);
  EXPECT_TRUE(torch::equal(p.param.grad(), torch::full({3}, 2.0f)));
  EXPECT_TRUE(scaler.step(p.sgd));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

TEST(GradScaler, AnotherRanksOverflowSkipsThisRanksStep) {
  GradScaler scaler;
  OneParam p;
  FakeRanks ranks;
  ranks.others_found = true;  // this rank's gradients are finite
  torch::Tensor before = p.param.detach().clone();
  p.backward(scaler, torch::tensor({1.0f, 1.0f, 1.0f}));
  scaler.unscale_(p.sgd, &ranks);
  EXPECT_FALSE(scaler.step(p.sgd, &ranks));
  EXPECT_TRUE(torch::equal(p.param.detach(), before));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(ranks.calls, 1) << "the ranks must agree exactly once per update";
  // step() without unscale_() asks them itself, once.
  ranks.others_found = false;
  p.backward(scaler, torch::tensor({1.0f, 1.0f, 1.0f}));
  EXPECT_TRUE(scaler.step(p.sgd, &ranks));
  EXPECT_EQ(ranks.calls, 2);
}

TEST(GradScaler, MisuseIsReported) {
  GradScaler scaler;
  OneParam p;
  EXPECT_THROW(scaler.update(), Error);  // nothing checked yet
  p.backward(scaler, torch::tensor({1.0f, 1.0f, 1.0f}));
  scaler.unscale_(p.sgd);
  EXPECT_THROW(scaler.unscale_(p.sgd), Error);  // would divide twice
  scaler.step(p.sgd);
  EXPECT_THROW(scaler.step(p.sgd), Error);
  scaler.update();
  EXPECT_THROW(GradScaler(GradScalerOptions().growth_factor(0.5)), Error);
  EXPECT_THROW(GradScaler(GradScalerOptions().backoff_factor(1.5)), Error);
  EXPECT_THROW(GradScaler(GradScalerOptions().init_scale(0)), Error);
}

// The stage machine behind those checks: a move it does not have is a bug in
// lockstep, reported as one, naming both stages. The public calls check first,
// so a user's wrong order gets the user's message, never this one.
TEST(GradScaler, AWrongStageMoveIsAnInternalErrorNamingBothStages) {
  using Stage = GradScaler::Stage;
  Stage stage = Stage::kReady;
  move_grad_scaler_stage(stage, Stage::kUnscaled);
  move_grad_scaler_stage(stage, Stage::kStepped);
  testing::expect_internal_error([&] { move_grad_scaler_stage(stage, Stage::kUnscaled); },
                                 "the GradScaler's stage for an optimizer has no move from stepped to unscaled");
  EXPECT_EQ(stage, Stage::kStepped);  // a refused move leaves the stage where it was
  Stage fresh = Stage::kReady;
  EXPECT_THROW(move_grad_scaler_stage(fresh, Stage::kStepped), InternalError);  // stepping skips unscaling

  GradScaler scaler;
  OneParam p;
  p.backward(scaler, torch::tensor({1.0f, 1.0f, 1.0f}));
  scaler.unscale_(p.sgd);
  const std::string users = testing::error_of([&] { scaler.unscale_(p.sgd); });
  EXPECT_NE(users.find("unscale_() was already called"), std::string::npos) << users;
  EXPECT_EQ(users.find("internal error"), std::string::npos) << "the user's wrong order reached the assertion";
}

TEST(GradScaler, StateRoundTripsThroughACheckpointFile) {
  GradScalerOptions options = GradScalerOptions().init_scale(1024).growth_interval(4);
  GradScaler scaler(options);
  OneParam p;
  for (bool overflow : {true, false, false}) {  // scale 512, tracker 2
    p.backward(scaler, torch::tensor({1.0f, overflow ? INFINITY : 1.0f, 1.0f}));
    scaler.step(p.sgd);
    scaler.update();
  }
  testing::TempDir dir;
  State parent;
  parent.put("grad_scaler", scaler.state());
  write_checkpoint_file(dir.file("scaler.ckpt"), parent);

  GradScaler resumed(options);
  resumed.load_state(read_checkpoint_file(dir.file("scaler.ckpt")).get("grad_scaler"));
  EXPECT_EQ(resumed.get_scale(), 512.0);
  EXPECT_EQ(resumed.growth_tracker(), 2);
  // Both continue alike: two more clean steps complete the interval of 4.
  OneParam q;
  for (int i = 0; i < 2; ++i) {
    for (auto* s : {&scaler, &resumed}) {
      OneParam& target = s == &scaler ? p : q;
      target.backward(*s, torch::tensor({1.0f, 1.0f, 1.0f}));
      s->step(target.sgd);
      s->update();
    }
  }
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(resumed.get_scale(), 1024.0);
  EXPECT_EQ(resumed.growth_tracker(), 0);

  State broken;
  broken.values["scale"] = -1.0;
  broken.values["growth_tracker"] = 0;
  EXPECT_THROW(resumed.load_state(broken), Error);
  EXPECT_THROW(resumed.load_state(State()), Error);
}

TEST(GradScaler, ParsesLossScaleConfigs) {
  GradScalerOptions dynamic = parse_loss_scale(Config::scalar("dynamic"));
  EXPECT_TRUE(dynamic.dynamic());
  EXPECT_EQ(dynamic.init_scale(), 65536.0);
  EXPECT_EQ(dynamic.growth_interval(), 2000);
  GradScalerOptions fixed = parse_loss_scale(Config::scalar("512"));
  EXPECT_FALSE(fixed.dynamic());
  EXPECT_EQ(fixed.init_scale(), 512.0);
  Config map = parse_config("{init_scale: 256, growth_factor: 4, backoff_factor: 0.25, growth_interval: 10}");
  GradScalerOptions custom = parse_loss_scale(map);
  EXPECT_TRUE(custom.dynamic());
  EXPECT_EQ(custom.init_scale(), 256.0);
  EXPECT_EQ(custom.growth_factor(), 4.0);
  EXPECT_EQ(custom.backoff_factor(), 0.25);
  EXPECT_EQ(custom.growth_interval(), 10);
  Config bad = parse_config("loss_scale: dynamik", "cfg.yaml");
  try {
    parse_loss_scale(bad.at("loss_scale"));
    FAIL() << "'dynamik' accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.yaml:1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_loss_scale(Config::scalar("-4")), Error);
  EXPECT_THROW(parse_loss_scale(parse_config("{growth_interval: 0}")), Error);
}

// The portable kernels against closed forms, and the fused ones (where this
// libtorch has them for CPU: 2.x) against the portable ones, bit for bit.

// Unscales copies of `grads`; `found` receives the flag.
std::vector<torch::Tensor> unscale_copies(const std::vector<torch::Tensor>& grads, float inv_scale,
                                          compat::AmpKernels kernels, torch::Tensor& found) {
  std::vector<torch::Tensor> copies;
  for (const auto& g : grads) copies.push_back(g.clone());
  found = torch::zeros({1});
  compat::non_finite_check_and_unscale(copies, found, torch::full({1}, inv_scale), kernels);
  return copies;
}

// (scale, tracker) after each update from 3.0 with growth 1.5, backoff 0.3, interval 3.
std::vector<std::pair<float, int>> update_trace(const std::vector<float>& flags, compat::AmpKernels kernels) {
  torch::Tensor scale = torch::full({1}, 3.0f);  // not a power of two: rounding shows
  torch::Tensor tracker = torch::zeros({1}, torch::kInt);
  std::vector<std::pair<float, int>> trace;
  for (float flag : flags) {
    compat::update_scale(scale, tracker, torch::full({1}, flag), 1.5, 0.3, 3, kernels);
    trace.emplace_back(scale.item<float>(), tracker.item<int>());
  }
  return trace;
}

const std::vector<float> kOverflowFlags{0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0};

TEST(AmpKernels, PortableUnscaleFollowsTheClosedForm) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> clean{torch::randn({5, 7}) * 1000, torch::randn({3}).to(torch::kDouble)};
  std::vector<torch::Tensor> dirty{torch::randn({4}), torch::randn({2, 2})};
  dirty[1][1][0] = INFINITY;
  torch::Tensor found;
  auto unscaled = unscale_copies(clean, 1.0f / 1024, compat::AmpKernels::kPortable, found);
  EXPECT_EQ(found.item<float>(), 0.0f);
  for (size_t i = 0; i < clean.size(); ++i) EXPECT_TRUE(torch::equal(unscaled[i], clean[i] / 1024)) << i;
  auto unscaled_dirty = unscale_copies(dirty, 1.0f / 1024, compat::AmpKernels::kPortable, found);
  EXPECT_EQ(found.item<float>(), 1.0f);
  EXPECT_TRUE(torch::equal(unscaled_dirty[0], dirty[0] / 1024)) << "finite tensors are unscaled even so";
  // Large finite values with a scale below 1 are not an overflow.
  unscale_copies({torch::full({2}, 1e38f)}, 4.0f, compat::AmpKernels::kPortable, found);
  EXPECT_EQ(found.item<float>(), 0.0f);
}

TEST(AmpKernels, PortableUpdateScaleFollowsTheClosedForm) {
  auto trace = update_trace(kOverflowFlags, compat::AmpKernels::kPortable);
  ASSERT_EQ(trace.size(), kOverflowFlags.size());
  // 3 -> clean, clean: 3 (tracker 2) -> overflow: 0.9 -> 3 clean: 1.35 (float32 products).
  const float backed_off = static_cast<float>(3.0 * 0.3);
  EXPECT_EQ(trace[1], std::make_pair(3.0f, 2));
  EXPECT_EQ(trace[2], std::make_pair(backed_off, 0));
  EXPECT_EQ(trace[5], std::make_pair(static_cast<float>(backed_off * 1.5), 0));
  EXPECT_EQ(trace[7], std::make_pair(static_cast<float>(static_cast<float>(trace[5].first * 0.3) * 0.3), 0));
}

TEST(AmpKernels, FusedKernelsMatchPortableOnesWherePresent) {
  torch::manual_seed(4);
  std::vector<torch::Tensor> grads{torch::randn({5, 7}) * 1000, torch::randn({3}).to(torch::kDouble) / 3};
  std::vector<torch::Tensor> dirty{torch::randn({4}), torch::randn({2, 2})};
  dirty[1][1][0] = NAN;
  torch::Tensor found;
  if (!compat::has_fused_amp_kernels(c10::DeviceType::CPU)) {
    EXPECT_THROW(unscale_copies(grads, 1.0f / 3, compat::AmpKernels::kFused, found), Error);
    GTEST_SKIP() << "this libtorch has no fused CPU scaler kernels (1.13)";
  }
  auto portable = unscale_copies(grads, 1.0f / 3, compat::AmpKernels::kPortable, found);
  auto fused = unscale_copies(grads, 1.0f / 3, compat::AmpKernels::kFused, found);
  EXPECT_EQ(found.item<float>(), 0.0f);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(torch::equal(fused[i], portable[i])) << i;
  unscale_copies(dirty, 1.0f / 3, compat::AmpKernels::kFused, found);
  EXPECT_EQ(found.item<float>(), 1.0f);
  EXPECT_EQ(update_trace(kOverflowFlags, compat::AmpKernels::kFused),
            update_trace(kOverflowFlags, compat::AmpKernels::kPortable));
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// As torch.amp.GradScaler: fp16 gradients are refused (unscaling them in fp16
// would flush the small values the scale was there to keep).
TEST(GradScaler, RefusesToUnscaleFloat16Gradients) {
  torch::Tensor param = torch::ones({3}, torch::kHalf).requires_grad_();
  torch::optim::SGD sgd{std::vector<torch::Tensor>{param}, torch::optim::SGDOptions(1.0)};
  param.mutable_grad() = torch::full({3}, 1024.0, torch::kHalf);
  GradScaler scaler;
  try {
    scaler.unscale_(sgd, nullptr);
    FAIL() << "fp16 gradients were unscaled";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("attempting to unscale FP16 gradients"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace lockstep
