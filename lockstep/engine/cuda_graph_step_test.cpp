#include "lockstep/engine/cuda_graph_step.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "lockstep/amp/amp_optim_wrapper.h"
#include "lockstep/compat/cuda.h"
#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/core/scalars_to_host.h"
#include "lockstep/model/log_values_on_device.h"
#include "lockstep/model/model.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/device_side_step.h"
#include "lockstep/optim/sgd.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

struct TinyModel : Model {
  TinyModel() {
    torch::manual_seed(0);
    fc = register_module("fc", torch::nn::Linear(4, 1));
  }
  LossDict loss(const Batch& data) override {
    LossDict losses;
    losses.insert("loss", torch::mse_loss(fc(data.at("x")).squeeze(1), data.at("y")));
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"y", fc(data.at("x"))}}; }
  torch::nn::Linear fc{nullptr};
};

Batch batch_of(int64_t rows, uint64_t seed) {
  torch::manual_seed(seed);
  return {{"x", torch::randn({rows, 4})}, {"y", torch::randn({rows})}};
}

Config graph_yaml(const std::string& text) { return parse_config(text, "run.yaml"); }

std::string graph_error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  }
  return "no error";
}

TEST(CudaGraphOptionsTest, WarmupDefaultsToThreeAndBadKeysAreNamed) {
  EXPECT_EQ(parse_cuda_graph_options(graph_yaml("cuda_graph: {}").at("cuda_graph")).warmup_iters(), 3);
  EXPECT_EQ(parse_cuda_graph_options(graph_yaml("cuda_graph: {warmup_iters: 11}").at("cuda_graph")).warmup_iters(), 11);
  const std::string zero = graph_error_of([] { parse_cuda_graph_options(graph_yaml("cuda_graph:\n  warmup_iters: 0").at("cuda_graph")); });
  EXPECT_THAT(zero, HasSubstr("run.yaml:2"));
  EXPECT_THAT(zero, HasSubstr("warmup_iters must be at least 1"));
  const std::string misspelt =
      graph_error_of([] { parse_cuda_graph_options(graph_yaml("cuda_graph: {warmup_iter: 5}").at("cuda_graph")); });
  EXPECT_THAT(misspelt, HasSubstr("warmup_iter"));
  EXPECT_THAT(misspelt, HasSubstr("warmup_iters"));  // the nearest known key
  EXPECT_THAT(graph_error_of([] { parse_cuda_graph_options(graph_yaml("cuda_graph: 3").at("cuda_graph")); }),
              HasSubstr("cuda_graph is a map"));
}

TEST(CudaGraphRefusals, AnOptimizerWithoutADeviceSideStepIsNamed) {
  TinyModel model;
  OptimWrapper rmsprop(std::make_shared<torch::optim::RMSprop>(model.parameters(), torch::optim::RMSpropOptions(0.1)));
  const std::string reason = prepare_optimizer_for_cuda_graph(rmsprop, "RMSprop");
  EXPECT_THAT(reason, HasSubstr("the optimizer 'RMSprop' has no device-side step"));
  EXPECT_THAT(reason, HasSubstr("SGD, Adam and AdamW"));
}

TEST(CudaGraphRefusals, SeveralOptimizersAreRefusedAndTheirNamesGiven) {
  TinyModel model;
  OptimWrapperDict dict;
  dict.add("generator", std::make_shared<OptimWrapper>(std::make_shared<lockstep::SGD>(
                            model.parameters(), torch::optim::SGDOptions(0.1))));
  dict.add("discriminator", std::make_shared<OptimWrapper>(std::make_shared<lockstep::SGD>(
                                model.parameters(), torch::optim::SGDOptions(0.1))));
  EXPECT_THAT(prepare_optimizer_for_cuda_graph(dict, "SGD"),
              HasSubstr("several optimizers (discriminator, generator)"));
}

TEST(CudaGraphRefusals, SgdWithDampeningIsRefusedAndOthersTurnCapturable) {
  TinyModel model;
  auto damped = std::make_shared<lockstep::SGD>(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.5));
  OptimWrapper damped_wrapper(damped);
  EXPECT_THAT(prepare_optimizer_for_cuda_graph(damped_wrapper, "SGD"), HasSubstr("dampening 0 only (got 0.5)"));
  EXPECT_FALSE(damped->capturable());

  auto adamw = std::make_shared<lockstep::AdamW>(model.parameters(), torch::optim::AdamWOptions(0.01));
  OptimWrapper adamw_wrapper(adamw);
  EXPECT_EQ(prepare_optimizer_for_cuda_graph(adamw_wrapper, "AdamW"), "");
  EXPECT_TRUE(adamw->capturable());
}

TEST(CudaGraphStepKinds, ShapesAccumulationAndGradientsSelectTheGraph) {
  TinyModel model;
  OptimWrapper wrapper(std::make_shared<lockstep::SGD>(model.parameters(), torch::optim::SGDOptions(0.1)),
                       OptimWrapperOptions().accumulative_counts(2));
  wrapper.initialize_count_status(0, 5);
  const std::string full = CudaGraphStep::step_kind(batch_of(8, 1), wrapper);
  EXPECT_EQ(CudaGraphStep::step_kind(batch_of(8, 2), wrapper), full) << "another batch of the same shapes";
  EXPECT_NE(CudaGraphStep::step_kind(batch_of(5, 1), wrapper), full) << "a partial batch";
  Batch doubles{{"x", torch::randn({8, 4}, torch::kDouble)}, {"y", torch::randn({8})}};
  EXPECT_NE(CudaGraphStep::step_kind(doubles, wrapper), full) << "another dtype";

  // Accumulating micro-step, then the one that updates: different graphs.
  wrapper.update_params(model.loss(batch_of(8, 1)).begin()->value());
  const std::string updating = CudaGraphStep::step_kind(batch_of(8, 1), wrapper);
  EXPECT_NE(updating, full);
  EXPECT_THAT(updating, HasSubstr("updates 1"));
  EXPECT_THAT(full, HasSubstr("gradients none"));
  EXPECT_THAT(updating, ::testing::Not(HasSubstr("gradients none")));
  wrapper.update_params(model.loss(batch_of(8, 1)).begin()->value());
  EXPECT_EQ(CudaGraphStep::step_kind(batch_of(8, 1), wrapper), full) << "the next window starts like the first";
  // Iteration 4 of 5 is a window of one: its loss is divided by 1, not 2.
  wrapper.update_params(model.loss(batch_of(8, 1)).begin()->value());
  wrapper.update_params(model.loss(batch_of(8, 1)).begin()->value());
  EXPECT_THAT(CudaGraphStep::step_kind(batch_of(8, 1), wrapper), HasSubstr("divisor 1"));
}

TEST(CudaGraphStepTest, WarmUpStepsRunEagerlyAndACaptureWithoutCudaSaysSo) {
  if (compat::built_with_cuda()) GTEST_SKIP() << "a CUDA build captures; gpu-check's cuda-graph step runs that";
  auto model = std::make_shared<TinyModel>();
  auto sgd = std::make_shared<lockstep::SGD>(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto wrapper = std::make_shared<OptimWrapper>(sgd);
  ASSERT_EQ(prepare_optimizer_for_cuda_graph(*wrapper, "SGD"), "");
  wrapper->initialize_count_status(0, 10);
  CudaGraphStep graphed(CudaGraphOptions().warmup_iters(2));
  StepContext step;
  for (int i = 0; i < 2; ++i) {
    CudaGraphStep::Outputs outputs = graphed.run(*model, *wrapper, batch_of(8, i), step);
    EXPECT_EQ(outputs.returned.count("loss"), 0u) << "the default train_step leaves its loss on the device";
    ASSERT_EQ(outputs.logged.count("loss"), 1u);
    EXPECT_GT(outputs.logged.at("loss").item<double>(), 0);
  }
  EXPECT_EQ(graphed.eager_steps(), 2);
  EXPECT_THAT(graph_error_of([&] { graphed.run(*model, *wrapper, batch_of(8, 2), step); }), HasSubstr("built without CUDA"));
}

TEST(CudaGraphStepTest, WarmUpGoesOnUntilAnAccumulationWindowStarts) {
  if (compat::built_with_cuda()) GTEST_SKIP() << "a CUDA build captures; gpu-check's cuda-graph step runs that";
  auto model = std::make_shared<TinyModel>();
  auto wrapper = std::make_shared<OptimWrapper>(
      std::make_shared<lockstep::SGD>(model->parameters(), torch::optim::SGDOptions(0.1)),
      OptimWrapperOptions().accumulative_counts(3));
  ASSERT_EQ(prepare_optimizer_for_cuda_graph(*wrapper, "SGD"), "");
  wrapper->initialize_count_status(0, 30);
  CudaGraphStep graphed(CudaGraphOptions().warmup_iters(1));
  StepContext step;
  // Steps 0, 1, 2 complete the first window eagerly; step 3 starts the next and is captured.
  for (int i = 0; i < 3; ++i) graphed.run(*model, *wrapper, batch_of(8, i), step);
  EXPECT_EQ(graphed.eager_steps(), 3);
  EXPECT_THAT(graph_error_of([&] { graphed.run(*model, *wrapper, batch_of(8, 3), step); }), HasSubstr("built without CUDA"));
}

// ---- on a GPU (gpu-check's unit step): the replayed step is the eager one ----

// A model and its optim wrapper on GPU 0, with a capturable optimizer.
struct GpuRun {
  std::shared_ptr<TinyModel> model;
  std::shared_ptr<OptimWrapper> wrapper;
};

enum class Precision { kFloat32, kFp16Scaled };

GpuRun gpu_run(const std::string& optimizer, Precision precision, int64_t accumulation, int64_t max_iters) {
  GpuRun run;
  run.model = std::make_shared<TinyModel>();
  run.model->to(torch::Device(torch::kCUDA, 0));
  std::shared_ptr<torch::optim::Optimizer> built;
  if (optimizer == "AdamW") {
    built = std::make_shared<lockstep::AdamW>(run.model->parameters(), torch::optim::AdamWOptions(0.01));
  } else {
    built = std::make_shared<lockstep::SGD>(run.model->parameters(),
                                            torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
  }
  OptimWrapperOptions options;
  ClipGradOptions clip;
  clip.kind = ClipGradOptions::Kind::kNorm;
  clip.max_norm = 1.0;
  options.accumulative_counts(accumulation).clip_grad(clip);
  if (precision == Precision::kFp16Scaled) {
    // From 2^22 the first steps overflow in fp16 and the scaler skips them
    // (the tiny model's gradients fit below about 2^18), then it steps.
    run.wrapper = std::make_shared<AmpOptimWrapper>(
        built, options, AmpOptions().dtype(torch::kHalf).loss_scale(GradScalerOptions().init_scale(4194304.0)));
  } else {
    run.wrapper = std::make_shared<OptimWrapper>(built, options);
  }
  EXPECT_EQ(prepare_optimizer_for_cuda_graph(*run.wrapper, optimizer), "");
  run.wrapper->initialize_count_status(0, max_iters);
  return run;
}

// Batch i: full batches of 16 rows, the last one partial (5 rows).
Batch gpu_batch(int64_t i, int64_t max_iters) { return batch_of(i + 1 == max_iters ? 5 : 16, 100 + i); }

// "" when both hold the same names with the same values, NaN matching NaN
// (a step the scaler skips logs a NaN grad_norm on both sides, and NaN == NaN
// is false); else what differs.
std::string differing_scalars(const std::map<std::string, double>& a, const std::map<std::string, double>& b) {
  std::string differences;
  for (const auto& [name, value] : a) {
    auto other = b.find(name);
    if (other == b.end()) {
      differences += name + " only on the left; ";
    } else if (!(value == other->second || (std::isnan(value) && std::isnan(other->second)))) {
      differences += name + " " + std::to_string(value) + " vs " + std::to_string(other->second) + "; ";
    }
  }
  for (const auto& [name, value] : b) {
    if (a.count(name) == 0) differences += name + " only on the right; ";
  }
  return differences;
}

void expect_same_weights(Model& a, Model& b) {
  auto left = a.named_parameters();
  auto right = b.named_parameters();
  for (const auto& item : left) {
    EXPECT_TRUE(torch::equal(item.value(), right[item.key()])) << item.key() << " differs";
  }
}

class CudaGraphOnGpu : public ::testing::TestWithParam<std::tuple<std::string, Precision, int64_t>> {};

TEST_P(CudaGraphOnGpu, ReplayedStepsAreBitwiseTheEagerCapturableOnes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: gpu-check's unit step runs this on a GPU";
  // cuBLAS is deterministic across streams (the capture's side stream) only
  // with a fixed workspace; read when its first handle is made.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  const auto& [optimizer, precision, accumulation] = GetParam();
  const int64_t max_iters = 21;
  GpuRun eager = gpu_run(optimizer, precision, accumulation, max_iters);
  GpuRun graphed = gpu_run(optimizer, precision, accumulation, max_iters);
  CudaGraphStep graph(CudaGraphOptions().warmup_iters(3));
  LogVars eager_losses;
  LogVars graphed_losses;
  for (int64_t i = 0; i < max_iters; ++i) {
    // A schedule changes the learning rate on the host each step; the replay must see it.
    for (GpuRun* run : {&eager, &graphed}) {
      for (auto& group : run->wrapper->optimizer().param_groups()) group.options().set_lr(0.01 * (1 + i % 4));
    }
    const Batch batch = gpu_batch(i, max_iters);
    StepContext step{i, nullptr};
    {
      LogValuesOnDevice logged;
      eager.model->run_train_step(batch, *eager.wrapper, step);
      logged.read_into(eager_losses);
    }
    CudaGraphStep::Outputs outputs = graph.run(*graphed.model, *graphed.wrapper, batch, step);
    read_logged_values(outputs.logged, graphed_losses);
    EXPECT_EQ(graphed_losses.at("loss"), eager_losses.at("loss")) << "iteration " << i;
    // grad_norm and loss_scale as logged after each step, accumulating micro-steps included.
    EXPECT_EQ(differing_scalars(scalars_to_host(graphed.wrapper->last_update_metric_tensors()),
                                scalars_to_host(eager.wrapper->last_update_metric_tensors())),
              "")
        << "iteration " << i;
  }
  expect_same_weights(*eager.model, *graphed.model);
  // The full batch's kinds of step, and the partial batch's one more.
  EXPECT_EQ(graph.graphs(), static_cast<size_t>(accumulation) + 1);
  if (precision == Precision::kFp16Scaled) {
    EXPECT_LT(scalars_to_host(graphed.wrapper->last_update_metric_tensors()).at("loss_scale"), 4194304.0)
        << "the scaler skipped steps";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Steps, CudaGraphOnGpu,
    ::testing::Values(std::make_tuple(std::string("SGD"), Precision::kFloat32, int64_t{1}),
                      std::make_tuple(std::string("AdamW"), Precision::kFloat32, int64_t{1}),
                      std::make_tuple(std::string("AdamW"), Precision::kFloat32, int64_t{2}),
                      std::make_tuple(std::string("SGD"), Precision::kFp16Scaled, int64_t{1}),
                      std::make_tuple(std::string("AdamW"), Precision::kFp16Scaled, int64_t{1})));

TEST(CudaGraphOnGpuRefusals, AHostReadInTheLossFailsTheCaptureNamingTheOperation) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: gpu-check's unit step runs this on a GPU";
  struct ReadsTheHost : TinyModel {
    LossDict loss(const Batch& data) override {
      LossDict losses = TinyModel::loss(data);
      if (losses["loss"].item<float>() > 1e9) losses["loss"] = losses["loss"] * 0;  // a host read, as models do
      return losses;
    }
  };
  auto model = std::make_shared<ReadsTheHost>();
  model->to(torch::Device(torch::kCUDA, 0));
  auto wrapper = std::make_shared<OptimWrapper>(
      std::make_shared<lockstep::SGD>(model->parameters(), torch::optim::SGDOptions(0.1)));
  ASSERT_EQ(prepare_optimizer_for_cuda_graph(*wrapper, "SGD"), "");
  wrapper->initialize_count_status(0, 10);
  CudaGraphStep graph(CudaGraphOptions().warmup_iters(1));
  graph.run(*model, *wrapper, batch_of(8, 0), StepContext());
  const std::string error = graph_error_of([&] { graph.run(*model, *wrapper, batch_of(8, 1), StepContext()); });
  EXPECT_THAT(error, HasSubstr("could not be captured"));
  EXPECT_THAT(error, HasSubstr("aten::_local_scalar_dense"));
}

}  // namespace
}  // namespace lockstep
