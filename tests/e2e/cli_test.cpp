// The `lockstep` command and a user's own program, run as a user would.
#include <gtest/gtest.h>

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
