// The `lockstep` command and a user's own program, run as a user would.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using testing::lockstep_binary;
using testing::run_command;

// A synthetic stand-in for Fashion-MNIST, so these runs take seconds.
const std::vector<std::string> kSyntheticData{
    "--set", "train_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 256, seed: 1}",
    "--set", "val_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 128, seed: 2}",
    "--set", "test_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 128, seed: 2}",
    "--set", "train_cfg.max_epochs=1"};

std::string demo_config() { return testing::source_dir() + "/examples/fashion_mnist/cnn.yaml"; }

TEST(Cli, HelpForEverySubcommand) {
  for (std::vector<std::string> args : {std::vector<std::string>{"--help"}, {"train", "--help"}, {"run", "--help"}}) {
    args.insert(args.begin(), lockstep_binary());
    auto result = run_command(args);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("Usage"), std::string::npos) << result.output;
  }
}

TEST(Cli, TrainsTheDemoConfigOnSyntheticDataAndReportsTestAccuracy) {
  testing::TempDir dir;
  std::vector<std::string> args{lockstep_binary(), "train", demo_config(), "--work-dir", dir.file("run")};
  args.insert(args.end(), kSyntheticData.begin(), kSyntheticData.end());
  auto result = run_command(args);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("Final test accuracy/top1: "), std::string::npos) << result.output;
  for (const char* file : {"config.yaml", "metrics.jsonl", "log.txt", "model_final.ckpt", "model_best.ckpt",
                           "last_checkpoint"}) {
    EXPECT_TRUE(testing::file_exists(dir.file("run/") + file)) << file;
  }
  // The resolved config records the overrides.
  EXPECT_NE(testing::read_file(dir.file("run/config.yaml")).find("SyntheticImages"), std::string::npos);
  // Resuming a finished run trains nothing more and still ends cleanly.
  args.push_back("--resume");
  auto resumed = run_command(args);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("Resuming from"), std::string::npos) << resumed.output;
}

struct BadConfigCase {
  std::string name;
  std::string yaml_or_override;  // a whole file (starting with "_base_") or a --set
  std::string expected;
};

TEST(Cli, BadConfigsFailWithTheirLocation) {
  testing::TempDir dir;
  const std::vector<BadConfigCase> cases{
      {"typo", "optim_wrapper.optimizer.momentun=0.9", "momentun"},
      {"wrong_type", "optim_wrapper.optimizer.lr=fast", "expected a number, got 'fast'"},
      {"negative_lr", "optim_wrapper.optimizer.lr=-0.1", "lr"},
      {"zero_batch", "train_dataloader.batch_size=0", "batch_size"},
      {"unknown_model", "model.type=ResNet9000", "unknown model type 'ResNet9000'; registered model types: "},
      {"malformed", "_base_: cnn.yaml\nmodel: {type: [\n", "bad.yaml:3:1: end of sequence flow not found"},
      // Unknown top-level keys: a typo must not silently train the default run.
      {"top_level_typo", "train.max_iters=30", "--set (key train): unknown top-level key (did you mean 'trainer', 'train_cfg' or 'train_dataloader'?)"},
      {"top_level_unknown", "foo=3", "--set (key foo): unknown top-level key; known keys: work_dir, "},
      {"top_level_in_file", "_base_: cnn.yaml\ntrian_cfg: {max_iters: 3}\n",
       "bad.yaml:2 (key trian_cfg): unknown top-level key (did you mean 'train_cfg'?)"},
      {"section_typo_suggests", "optim_wrapper.optimizer.momentun=0.9", "(did you mean 'momentum'?)"},
  };
  for (const auto& bad : cases) {
    std::vector<std::string> args{lockstep_binary(), "train"};
    if (bad.yaml_or_override.rfind("_base_", 0) == 0) {
      std::string path = dir.file("bad.yaml");
      std::string text = bad.yaml_or_override;
      text.replace(text.find("cnn.yaml"), 8, demo_config());
      testing::write_file(path, text);
      args.push_back(path);
    } else {
      args.insert(args.end(), {demo_config(), "--set", bad.yaml_or_override});
    }
    args.insert(args.end(), {"--work-dir", dir.file(bad.name)});
    args.insert(args.end(), kSyntheticData.begin(), kSyntheticData.end());
    auto result = run_command(args, {}, 120);
    EXPECT_EQ(result.exit_code, 1) << bad.name << "\n" << result.output;
    EXPECT_NE(result.output.find(bad.expected), std::string::npos) << bad.name << "\n" << result.output;
    EXPECT_EQ(result.output.find("Segmentation"), std::string::npos) << bad.name;
  }
}

// A distributed config started as one process (no launcher, or --nproc 1) runs as a world of one.
TEST(Cli, DistributedConfigRunsAsOneProcessWithoutALauncher) {
  testing::TempDir dir;
  for (const std::vector<std::string>& extra : {std::vector<std::string>{}, {"--nproc", "1"}}) {
    std::vector<std::string> args{lockstep_binary(), "train", testing::source_dir() + "/examples/fashion_mnist/cnn_ddp.yaml",
                                  "--work-dir", dir.file("run" + std::to_string(extra.size())), "--no-test",
                                  "--set", "train_cfg={_delete_: true, max_iters: 3, val_interval: 3}"};
    args.insert(args.end(), kSyntheticData.begin(), kSyntheticData.end() - 2);  // not max_epochs
    args.insert(args.end(), extra.begin(), extra.end());
    auto result = run_command(args, {}, 120);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("running as a world of one process"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("strategy DDPStrategy (1 process)"), std::string::npos) << result.output;
  }
}

// Started by a launcher as one of 2 processes, a config that trains alone
// refuses instead of writing two independent runs into one work dir.
TEST(Cli, SingleProcessConfigUnderALauncherOfTwoRefuses) {
  testing::TempDir dir;
  std::vector<std::string> args{lockstep_binary(), "train", demo_config(), "--work-dir", dir.file("run"), "--nproc", "2"};
  args.insert(args.end(), kSyntheticData.begin(), kSyntheticData.end());
  auto result = run_command(args, {}, 120);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("of 2 started together by a launcher, but the strategy (SingleDeviceStrategy) trains "
                               "in one process"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(testing::file_exists(dir.file("run/model_final.ckpt")));
}

// FSDP mixed precision from a config: the model's inputs are cast to
// param_dtype (PyTorch's cast_root_forward_inputs), training and evaluation
// run in bfloat16, and the checkpoint keeps parameters and BatchNorm buffers
// in float32 (buffer_dtype is for training only).
TEST(Cli, FsdpMixedPrecisionTrainsAndSavesFullPrecision) {
  testing::TempDir dir;
  std::vector<std::string> args{lockstep_binary(), "train", demo_config(), "--work-dir", dir.file("run"), "--nproc", "2",
                                "--set", "strategy={type: FSDPStrategy, launcher: pytorch, backend: gloo, model_wrapper: "
                                "{sharding_strategy: FULL_SHARD, auto_wrap_policy: {type: size_based, min_num_params: 1000}, "
                                "mixed_precision: {param_dtype: bf16, buffer_dtype: bf16}}}",
                                "--set", "optim_wrapper.paramwise_cfg=null",
                                "--set", "train_cfg={_delete_: true, max_iters: 4, val_interval: 4}"};
  args.insert(args.end(), kSyntheticData.begin(), kSyntheticData.end() - 2);  // not max_epochs
  auto result = run_command(args, {}, 300);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("Final test accuracy/top1: "), std::string::npos) << result.output;
  auto inspected = run_command({lockstep_binary(), "ckpt", "inspect", "--json", "--no-config", dir.file("run/model_final.ckpt")});
  ASSERT_EQ(inspected.exit_code, 0) << inspected.output;
  const auto info = nlohmann::json::parse(inspected.output);
  int checked = 0;
  for (const auto& tensor : info.at("tensors")) {
    const std::string name = tensor.at("name");
    if (name.rfind("model/", 0) != 0 || name.find("num_batches_tracked") != std::string::npos) continue;
    EXPECT_EQ(tensor.at("dtype"), "F32") << name;
    checked += 1;
  }
  EXPECT_GE(checked, 10) << inspected.output;  // weights, biases, running means and variances
}

TEST(Cli, UsersOwnProgramTrainsItsOwnModel) {
  testing::TempDir dir;
  std::vector<std::string> args{testing::binary_dir() + "/examples/custom_model",
                                testing::source_dir() + "/examples/custom_model/lenet.yaml", "--work-dir",
                                dir.file("lenet")};
  args.insert(args.end(), kSyntheticData.begin(), kSyntheticData.end());
  auto result = run_command(args);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("LeNet test accuracy: "), std::string::npos) << result.output;
  EXPECT_NE(testing::read_file(dir.file("lenet/config.yaml")).find("type: LeNet"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
