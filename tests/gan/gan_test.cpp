// The GAN example (examples/gan: its model, dataset, sample hook and its very
// gan.yaml) on 2 ranks with separate DDP and two optimizers, shrunk to a few
// iterations on synthetic images:
// - it trains, logs both losses and the learning rate of each optimizer (each
//   with its own schedulers), and writes sample grids every N iterations;
// - a run that crashes and resumes from a checkpoint holding both optimizers
//   ends bitwise where an uninterrupted run ends.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "examples/gan/dcgan.h"
#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/runner/runner.h"
#include "lockstep/hooks/hook_registry.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

// 2 ranks x 8 images = 96 images in 6 iterations per epoch; 12 iterations.
const std::vector<std::string> kTinyRun{
    "train_dataloader.dataset.dataset={_delete_: true, type: SyntheticImages, size: 96, seed: 1}",
    "train_dataloader.batch_size=8",
    "train_cfg={_delete_: true, max_iters: 12, by_epoch: false}",
    "model.generator_channels=8",
    "model.discriminator_channels=8",
    "custom_hooks=[{type: GanSampleGrid, interval: 5, num_samples: 16, columns: 4}]",
    "default_hooks.logger.interval=1",
    "default_hooks.checkpoint={by_epoch: false, interval: 6, max_keep_ckpts: -1}",
};
constexpr int64_t kItersPerEpoch = 6;

struct FailAtIteration : Hook {
  explicit FailAtIteration(int64_t iteration) : Hook("FailAtIteration"), iteration_(iteration) {}
  void before_step() override {
    if (trainer().iter() == iteration_) throw std::runtime_error("simulated crash");
  }
  int64_t iteration_;
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

// PHASE=straight: the whole run; crash: stops at iteration 9 (after the
// checkpoint of iteration 5); resume: continues the crashed run.
LOCKSTEP_WORKER_TEST(GanWorker, Run) {
  dcgan::register_components();
  if (!hook_registry().contains("FailAtIteration")) {
    hook_registry().add("FailAtIteration", [](const Config& config, const HookContext&) {
      return std::make_shared<FailAtIteration>(config.get<int64_t>("iteration"));
    });
  }
  const std::string phase = env_or("PHASE", "straight");
  Config config = load_config(testing::source_dir() + "/examples/gan/gan.yaml");
  for (const auto& assignment : kTinyRun) config.apply_override(assignment);
  if (phase == "crash") {
    config.apply_override("custom_hooks=[{type: GanSampleGrid, interval: 5, num_samples: 16, columns: 4}, "
                          "{type: FailAtIteration, iteration: 9}]");
  }
  Runner runner(config, RunnerOptions().work_dir(env_or("RUN_DIR", "/tmp/lockstep_gan")).resume(phase == "resume"));
  ASSERT_EQ(runner.strategy().collectives()->world_size(), 2);
  if (phase == "crash") {
    EXPECT_THROW(runner.train(), std::runtime_error);
  } else {
    runner.train();
    EXPECT_EQ(runner.trainer().iter(), 12);
  }
}

// Runs one phase on 2 ranks; an error with all worker output if it fails.
testing::CommandResult run_phase(const std::string& name, const std::string& dir) {
  testing::WorkersOptions options;
  options.env = {"PHASE=" + name, "RUN_DIR=" + dir};
  options.timeout_s = 300;
  auto result = testing::run_workers(2, "GanWorker.Run", options);
  EXPECT_EQ(result.exit_code, 0) << "phase " << name << ", worker output:\n" << result.output;
  return result;
}


std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream file(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(file, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// Width and height from a PNG's IHDR chunk (after the signature and chunk header).
std::pair<uint32_t, uint32_t> png_size(const std::string& path) {
  std::string bytes = testing::read_file(path);
  EXPECT_GE(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  auto be32 = [&](size_t at) {
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i) value = (value << 8) | static_cast<uint8_t>(bytes[at + i]);
    return value;
  };
  return {be32(16), be32(20)};
}

TEST(GanExample, TrainsOnTwoRanksLogsBothLossesAndEachLearningRateAndWritesSamples) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  auto result = run_phase("straight", dir.path());
  ASSERT_EQ(result.exit_code, 0);

  // Grids after 5 and 10 iterations and at the end: 4x4 images of 28x28, 2 pixels apart and around.
  for (const char* name : {"samples_0000005.png", "samples_0000010.png", "samples_0000012.png"}) {
    ASSERT_TRUE(testing::file_exists(dir.file(name))) << name;
    EXPECT_EQ(png_size(dir.file(name)), std::make_pair(4u * 28 + 5 * 2, 4u * 28 + 5 * 2)) << name;
  }
  EXPECT_FALSE(testing::file_exists(dir.file("samples_0000006.png")));

  auto metrics = read_metrics(dir.file("metrics.jsonl"));
  int64_t checked = 0;
  for (const auto& line : metrics) {
    if (!line.contains("loss_g")) continue;
    const int64_t i = line.at("iteration").get<int64_t>();
    const double loss_d = line.at("loss_d"), loss_g = line.at("loss_g");
    EXPECT_TRUE(std::isfinite(loss_d) && loss_d > 0) << line;
    EXPECT_TRUE(std::isfinite(loss_g) && loss_g > 0) << line;
    // gan.yaml: both start with LinearLR {start_factor: 0.25, begin: 0,
    // end: 100}, which (as mmengine's) reaches 1 at step end - 1:
    // lr_i = 2e-4 * (0.25 + 0.75 * i / 99). Only the discriminator adds a
    // cosine schedule from epoch 1 (iteration 6), which moves it from 7 on.
    const double linear = 2e-4 * (0.25 + 0.75 * static_cast<double>(i) / 99.0);
    const double lr_d = line.at("lr/discriminator").get<double>();
    EXPECT_NEAR(line.at("lr/generator").get<double>(), linear, 1e-15) << line;
    if (i <= kItersPerEpoch) {
      EXPECT_NEAR(lr_d, linear, 1e-15) << line;
    } else {
      EXPECT_GT(std::abs(lr_d - linear), 0.01 * linear) << line;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 12);
  // The console line shows both losses and both learning rates.
  EXPECT_NE(result.output.find("loss_d: "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("loss_g: "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("lr/generator: "), std::string::npos) << result.output;
}

TEST(GanExample, CheckpointWithBothOptimizersResumesBitwise) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  const std::string straight = dir.file("straight"), interrupted = dir.file("interrupted");
  ASSERT_EQ(run_phase("straight", straight).exit_code, 0);
  ASSERT_EQ(run_phase("crash", interrupted).exit_code, 0);
  ASSERT_FALSE(testing::file_exists(interrupted + "/model_final.ckpt"));
  ASSERT_TRUE(testing::file_exists(interrupted + "/model_0000005.ckpt"));
  ASSERT_EQ(run_phase("resume", interrupted).exit_code, 0);

  State a = read_checkpoint_file(straight + "/model_final.ckpt");
  State b = read_checkpoint_file(interrupted + "/model_final.ckpt");
  // Both optimizers are in it, each with its Adam moments, and each optimizer's schedulers.
  State optim = a.get("optim_wrapper");
  for (const char* name : {"generator", "discriminator"}) {
    ASSERT_TRUE(optim.contains(name)) << name;
    EXPECT_FALSE(optim.get(name).tensors.empty()) << name;
    ASSERT_TRUE(a.get("param_schedulers").contains(name)) << name;
  }
  EXPECT_EQ(a.get("param_schedulers").get("discriminator").values.size(), 2u);
  // Every tensor (weights, BatchNorm statistics, Adam moments, RNG and loader
  // state) bitwise equal, and the optimizer and scheduler values too.
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [key, tensor] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(key)) << key;
    EXPECT_TRUE(tensor.dtype() == b.tensors.at(key).dtype() && torch::equal(tensor, b.tensors.at(key))) << key;
  }
  EXPECT_EQ(a.values.at("optim_wrapper"), b.values.at("optim_wrapper"));
  EXPECT_EQ(a.values.at("param_schedulers"), b.values.at("param_schedulers"));
  // The weights moved from their initial values (the comparison is not of two untrained models).
  State first = read_checkpoint_file(interrupted + "/model_0000005.ckpt");
  EXPECT_FALSE(torch::equal(first.get("model").tensors.at("generator.0.weight"),
                            a.get("model").tensors.at("generator.0.weight")));
}

}  // namespace
}  // namespace lockstep
