#include "lockstep/runner/step_trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/engine/trainer.h"
#include "lockstep/model/model.h"
#include "lockstep/builtin_models/module_model.h"
#include "lockstep/runner/runner.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

// A one-process run of lockstep's MLP on batches the test makes itself.
std::string config_text(const std::string& extra = "") {
  return R"YAML(
randomness: {seed: 9}
model:
  type: MLP
  in_features: 16
  hidden: [12]
  num_classes: 3
optim_wrapper:
  optimizer: {type: SGD, lr: 0.1, momentum: 0.9}
  accumulative_counts: 2
param_scheduler:
  - {type: LinearLR, by_epoch: false, start_factor: 0.5, begin: 0, end: 6}
default_hooks:
  logger: {interval: 2}
  checkpoint: {interval: 100}
)YAML" + extra;
}

Batch batch_for(int64_t step) {
  torch::manual_seed(static_cast<uint64_t>(100 + step));
  return Batch{{"image", torch::randn({6, 16})}, {"label", torch::randint(0, 3, {6}, torch::kLong)}};
}

std::map<std::string, torch::Tensor> weights_of(StepTrainer& trainer) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : trainer.model().named_parameters()) weights[item.key()] = item.value().detach().clone();
  return weights;
}

bool same(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, tensor] : a) {
    if (!b.count(name) || !torch::equal(tensor, b.at(name))) return false;
  }
  return true;
}

TEST(StepTrainer, TrainsOneIterationPerCallAndCountsIt) {
  testing::TempDir dir;
  StepTrainer trainer(parse_config(config_text(), "steps.yaml"), StepTrainerOptions().work_dir(dir.path()));
  EXPECT_EQ(trainer.iteration(), 0);
  const auto before = weights_of(trainer);
  LogVars first = trainer.train_step(batch_for(0));
  EXPECT_TRUE(first.count("loss"));
  EXPECT_EQ(trainer.iteration(), 1);
  // accumulative_counts 2: the first micro-step only accumulates.
  EXPECT_TRUE(same(before, weights_of(trainer)));
  trainer.train_step(batch_for(1));
  EXPECT_FALSE(same(before, weights_of(trainer)));
  trainer.log_scalar("residual", 0.25);
  EXPECT_TRUE(trainer.trainer().storage().has("residual"));
  Batch predicted = trainer.predict(Batch{{"image", torch::randn({2, 16})}});
  EXPECT_EQ(predicted.at("logits").sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(trainer.model().is_training());
  trainer.finish();
  EXPECT_TRUE(testing::file_exists(dir.file("model_final.ckpt")));
  EXPECT_THROW(trainer.train_step(batch_for(2)), Error);
}

TEST(StepTrainer, AFailedStepIsNotCountedAndTheNextOneRuns) {
  testing::TempDir dir;
  StepTrainer trainer(parse_config(config_text(), "steps.yaml"), StepTrainerOptions().work_dir(dir.path()));
  trainer.train_step(batch_for(0));
  EXPECT_THROW(trainer.train_step(Batch{{"image", torch::randn({6, 5})}, {"label", torch::zeros({6}, torch::kLong)}}),
               std::exception);
  EXPECT_EQ(trainer.iteration(), 1);
  trainer.train_step(batch_for(1));
  EXPECT_EQ(trainer.iteration(), 2);
}

// Saved between steps (inside an accumulation window, with a scheduler
// moving the lr), loaded into a fresh trainer: the next steps are the
// uninterrupted run's, bitwise.
TEST(StepTrainer, ACheckpointSavedBetweenStepsResumesBitwise) {
  testing::TempDir dir;
  StepTrainer straight(parse_config(config_text(), "steps.yaml"), StepTrainerOptions().work_dir(dir.file("a")));
  for (int64_t step = 0; step < 8; ++step) straight.train_step(batch_for(step));

  {
    StepTrainer first(parse_config(config_text(), "steps.yaml"), StepTrainerOptions().work_dir(dir.file("b")));
    for (int64_t step = 0; step < 4; ++step) first.train_step(batch_for(step));
    EXPECT_EQ(first.save_checkpoint("after_four"), dir.file("b/after_four.ckpt"));
  }
  StepTrainer second(parse_config(config_text(), "steps.yaml"), StepTrainerOptions().work_dir(dir.file("c")));
  EXPECT_EQ(second.load_checkpoint(dir.file("b/after_four.ckpt")), 3);  // written after iteration 3
  EXPECT_EQ(second.iteration(), 4);
  for (int64_t step = 4; step < 8; ++step) second.train_step(batch_for(step));
  EXPECT_TRUE(same(weights_of(straight), weights_of(second)));

  // `resume: true` finds it the way lockstep train --resume does.
  StepTrainer third(parse_config(config_text(), "steps.yaml"),
                    StepTrainerOptions().work_dir(dir.file("b")).resume(true));
  EXPECT_EQ(third.iteration(), 4);
}

// A network built in code (any torch::nn::Module), the rest from the config:
// it learns y = 2x - 1 and predicts under ModuleModel's keys.
TEST(StepTrainer, AModuleBuiltInCodeTrainsWithTheConfigsOptimizer) {
  testing::TempDir dir;
  torch::manual_seed(4);
  torch::nn::Linear net(1, 1);
  auto model = std::make_shared<ModuleModel>(net, ModuleModelOptions().loss("mse"));
  StepTrainer trainer(model, parse_config("optim_wrapper: {optimizer: {type: SGD, lr: 0.1}}\n", "code.yaml"),
                      StepTrainerOptions().work_dir(dir.path()));
  double first = 0, last = 0;
  for (int64_t step = 0; step < 200; ++step) {
    torch::Tensor x = 2 * torch::rand({16, 1}) - 1;
    last = trainer.train_step(Batch{{"input", x}, {"target", 2 * x - 1}}).at("loss");
    if (step == 0) first = last;
  }
  EXPECT_LT(last, first / 100);
  torch::Tensor predicted = trainer.predict(Batch{{"input", torch::ones({1, 1})}}).at("output");
  EXPECT_NEAR(predicted.item<double>(), 1.0, 0.05);
  EXPECT_NE(testing::error_of([&] {
              StepTrainer both(std::make_shared<ModuleModel>(torch::nn::Linear(1, 1)),
                               parse_config(config_text(), "steps.yaml"), StepTrainerOptions().work_dir(dir.path()));
            }).find("give it there or in the config, not both"),
            std::string::npos);
}

TEST(StepTrainer, EpochsAndTrainingDataAreRefusedWithTheKey) {
  EXPECT_NE(testing::error_of([] {
              StepTrainer trainer(parse_config(config_text("train_cfg: {max_epochs: 3}\n"), "steps.yaml"));
            }).find("(key train_cfg.max_epochs)"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              StepTrainer trainer(parse_config(
                  config_text("train_dataloader: {batch_size: 4, dataset: {type: SyntheticImages}}\n"), "steps.yaml"));
            }).find("feeds its own batches"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              Config config = parse_config(config_text(), "steps.yaml");
              config.apply_override("default_hooks.checkpoint.by_epoch=true");
              StepTrainer trainer(config);
            }).find("count in iterations with by_epoch: false"),
            std::string::npos);
}

TEST(StepTrainer, CudaGraphOnTheCpuIsRefusedBeforeTheFirstStepNamingTheKey) {
  testing::TempDir dir;
  const std::string error = testing::error_of([&] {
    // On the CPU by choice: `device: auto` takes a GPU where there is one, and captures.
    StepTrainer trainer(parse_config(config_text("cuda_graph: {warmup_iters: 2}\n"
                                                 "strategy: {type: SingleDeviceStrategy, device: cpu}\n"),
                                     "steps.yaml"),
                        StepTrainerOptions().work_dir(dir.path()));
  });
  EXPECT_NE(error.find("(key cuda_graph)"), std::string::npos) << error;
  EXPECT_NE(error.find("cannot capture this run's training step: SingleDeviceStrategy trains on cpu"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace lockstep
