// A run interrupted and resumed must end bitwise where an uninterrupted run
// ends: weights, optimizer momentum, scheduler position, data order (with
// background workers) and the random state that dropout draws from.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/core/png.h"
#include "lockstep/runner/runner.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/strategy/strategy.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

// Stops the run with an exception at a chosen iteration, as a crash would.
struct FailAtIteration : Hook {
  explicit FailAtIteration(int64_t iteration) : Hook("FailAtIteration"), iteration_(iteration) {}
  void before_step() override {
    if (trainer().iter() == iteration_) throw std::runtime_error("simulated crash");
  }
  int64_t iteration_;
};
LOCKSTEP_REGISTER(hook_registry(), "FailAtIteration", [](const Config& config, const HookContext&) {
  return std::make_shared<FailAtIteration>(config.get<int64_t>("iteration"));
});

const char* const kResumeConfig = R"YAML(
randomness: {seed: 1234}
model:
  type: ConvNet
  channels: [4, 8]
  hidden: 16
  dropout: 0.3
  image_size: 12
  data_preprocessor: {type: ImgDataPreprocessor, mean: [100.0], std: [60.0]}
train_dataloader:
  batch_size: 16
  num_workers: 2
  sampler: {type: DefaultSampler, shuffle: true}
  dataset: {type: SyntheticImages, size: 200, height: 12, width: 12, seed: 3}
train_cfg: {max_iters: 40}
optim_wrapper:
  optimizer: {type: SGD, lr: 0.05, momentum: 0.9, weight_decay: 0.0001}
param_scheduler:
  - {type: LinearLR, start_factor: 0.2, by_epoch: false, begin: 0, end: 10}
  - {type: CosineAnnealingLR, by_epoch: false, begin: 0, end: 40, T_max: 40}
default_hooks:
  logger: {interval: 10}
  checkpoint: {by_epoch: false, interval: 10, max_keep_ckpts: 2}
)YAML";

std::map<std::string, torch::Tensor> final_weights(const std::string& work_dir) {
  return read_checkpoint_file(work_dir + "/model_final.ckpt").get("model").tensors;
}

TEST(Resume, InterruptedRunEndsBitwiseEqualToUninterrupted) {
  testing::TempDir dir;
  const std::string straight = dir.file("straight");
  const std::string interrupted = dir.file("interrupted");
  {
    Runner runner(parse_config(kResumeConfig, "resume.yaml"), RunnerOptions().work_dir(straight));
    runner.train();
  }
  {
    Config config = parse_config(kResumeConfig, "resume.yaml");
    config.apply_override("custom_hooks=[{type: FailAtIteration, iteration: 25}]");
    Runner runner(config, RunnerOptions().work_dir(interrupted));
    EXPECT_THROW(runner.train(), std::runtime_error);
  }
  EXPECT_FALSE(testing::file_exists(interrupted + "/model_final.ckpt"));
  EXPECT_TRUE(testing::file_exists(interrupted + "/model_0000019.ckpt"));
  // Perturb global random state: resume must restore it from the checkpoint.
  torch::manual_seed(999);
  {
    Runner runner(parse_config(kResumeConfig, "resume.yaml"), RunnerOptions().work_dir(interrupted).resume(true));
    runner.train();
    EXPECT_EQ(runner.trainer().start_iter(), 20);
  }
  auto a = final_weights(straight);
  auto b = final_weights(interrupted);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) {
    EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name << " differs after resume";
  }
  // max_keep_ckpts: 2 survived the restart: only the two newest periodic files remain.
  EXPECT_FALSE(testing::file_exists(interrupted + "/model_0000009.ckpt"));
  EXPECT_FALSE(testing::file_exists(interrupted + "/model_0000019.ckpt"));
  EXPECT_TRUE(testing::file_exists(interrupted + "/model_0000029.ckpt"));
  EXPECT_TRUE(testing::file_exists(interrupted + "/model_0000039.ckpt"));
}

// The same through ImageFolder: PNG files, random crops, flips and colour
// jitter drawn per example from (seed, epoch, index).
TEST(Resume, ImageFolderWithRandomAugmentationResumesBitwise) {
  testing::TempDir dir;
  torch::manual_seed(5);
  for (int i = 0; i < 60; ++i) {
    const std::string folder = dir.file("images/class" + std::to_string(i % 3));
    std::filesystem::create_directories(folder);
    write_png(folder + "/" + std::to_string(i) + ".png", torch::randint(0, 256, {3, 16, 16}, torch::kUInt8));
  }
  auto config = [&] {
    Config config = parse_config(kResumeConfig, "resume.yaml");
    config.apply_override("train_dataloader.dataset={_delete_: true, type: ImageFolder, root: " + dir.file("images") +
                          ", mode: gray, pipeline: [{type: RandomResizedCrop, size: 12, scale: [0.5, 1.0]}, "
                          "{type: RandomHorizontalFlip}, {type: ColorJitter, brightness: 0.3, contrast: 0.3}]}");
    return config;
  };
  const std::string straight = dir.file("straight"), interrupted = dir.file("interrupted");
  Runner(config(), RunnerOptions().work_dir(straight)).train();
  {
    Config crashing = config();
    crashing.apply_override("custom_hooks=[{type: FailAtIteration, iteration: 25}]");
    Runner runner(crashing, RunnerOptions().work_dir(interrupted));
    EXPECT_THROW(runner.train(), std::runtime_error);
  }
  Runner resumed(config(), RunnerOptions().work_dir(interrupted).resume(true));
  resumed.train();
  EXPECT_EQ(resumed.trainer().start_iter(), 20);
  auto a = final_weights(straight);
  auto b = final_weights(interrupted);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name << " differs after resume";
}

// EMAHook's average and step count come back from the checkpoint: the
// resumed run ends with the same weights and the same average, bitwise.
TEST(Resume, EmaHookResumesBitwise) {
  testing::TempDir dir;
  const std::string ema = "{type: EMAHook, momentum: 0.05, interval: 2, begin_iter: 4, update_buffers: true}";
  const std::string straight = dir.file("straight"), interrupted = dir.file("interrupted");
  {
    Config config = parse_config(kResumeConfig, "resume.yaml");
    config.apply_override("custom_hooks=[" + ema + "]");
    Runner(config, RunnerOptions().work_dir(straight)).train();
  }
  {
    Config config = parse_config(kResumeConfig, "resume.yaml");
    config.apply_override("custom_hooks=[" + ema + ", {type: FailAtIteration, iteration: 25}]");
    Runner runner(config, RunnerOptions().work_dir(interrupted));
    EXPECT_THROW(runner.train(), std::runtime_error);
  }
  {
    Config config = parse_config(kResumeConfig, "resume.yaml");
    config.apply_override("custom_hooks=[" + ema + "]");
    Runner runner(config, RunnerOptions().work_dir(interrupted).resume(true));
    runner.train();
    EXPECT_EQ(runner.trainer().start_iter(), 20);
  }
  const CheckpointContents a = read_checkpoint(straight + "/model_final.ckpt");
  const CheckpointContents b = read_checkpoint(interrupted + "/model_final.ckpt");
  ASSERT_TRUE(a.trainer && b.trainer);
  int averaged = 0;
  for (const auto& [name, tensor] : a.trainer->tensors) {
    ASSERT_TRUE(b.trainer->tensors.count(name)) << name;
    EXPECT_TRUE(torch::equal(tensor, b.trainer->tensors.at(name))) << name << " differs after resume";
    averaged += name.find("EMAHook") != std::string::npos;
  }
  EXPECT_GT(averaged, 4);
  for (const auto& [name, tensor] : final_weights(straight)) {
    EXPECT_TRUE(torch::equal(tensor, final_weights(interrupted).at(name))) << name;
  }
}

TEST(Resume, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  testing::TempDir dir;
  const std::string work_dir = dir.file("run");
  {
    Config config = parse_config(kResumeConfig, "resume.yaml");
    config.apply_override("custom_hooks=[{type: FailAtIteration, iteration: 35}]");
    config.apply_override("default_hooks.checkpoint.max_keep_ckpts=3");
    Runner runner(config, RunnerOptions().work_dir(work_dir));
    EXPECT_THROW(runner.train(), std::runtime_error);
  }
  // Flip one byte in the newest checkpoint.
  std::string bytes = testing::read_file(work_dir + "/model_0000029.ckpt");
  bytes[bytes.size() / 2] ^= 0x01;
  testing::write_file(work_dir + "/model_0000029.ckpt", bytes);
  Runner runner(parse_config(kResumeConfig, "resume.yaml"), RunnerOptions().work_dir(work_dir).resume(true));
  runner.train();
  EXPECT_EQ(runner.trainer().start_iter(), 20) << "should have resumed from model_0000019 after skipping the corrupt file";
  EXPECT_NE(testing::read_file(work_dir + "/log.txt").find("Skipping checkpoint"), std::string::npos);
}

TEST(Resume, ResumeWithoutCheckpointStartsFromScratch) {
  testing::TempDir dir;
  Config config = parse_config(kResumeConfig, "resume.yaml");
  config.apply_override("train_cfg.max_iters=3");
  Runner runner(config, RunnerOptions().work_dir(dir.file("fresh")).resume(true));
  runner.train();
  EXPECT_EQ(runner.trainer().start_iter(), 0);
  EXPECT_EQ(runner.trainer().iter(), 3);
}

}  // namespace
}  // namespace lockstep
