// A full checkpoint moves between FSDP and DDP on the user's path: `lockstep
// train` stops at iteration 10 under one strategy, `lockstep train --resume`
// carries on to 20 under the other (model, AdamW state with per-parameter
// groups, trainer state), and the result equals 20 iterations under DDP
// alone. Both directions, with paramwise_cfg (FSDP's use_orig_params) and with
// FSDP's default flat shards. And a sharded checkpoint with use_orig_params
// resumes bitwise.
//
// Two-rank FSDP trains the same bits as DDP (the differential suite's
// FSDP_AdamW_Paramwise came out bitwise), so the comparison allows only 1e-6: an
// optimizer state lost or misplaced on the way moves weights by about the
// learning rate (2e-3) in the first step after the move.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "tests/support/multiprocess.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

const std::string kFashionMnist = "/usr/share/datasets/fashion-mnist";

std::string config(int max_iters, const std::string& strategy, bool paramwise, const std::string& clip = "") {
  std::string yaml =
      "randomness: {seed: 3}\n"
      "env: {num_threads: 1}\n"
      "model:\n  type: ConvNet\n  channels: [8, 16]\n  hidden: 32\n  batch_norm: true\n"
      "  data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02]}\n"
      "train_dataloader:\n  batch_size: 16\n  num_workers: 0\n  sampler: {type: DefaultSampler, shuffle: true}\n"
      "  dataset: {type: FashionMNIST, root: " + kFashionMnist + ", split: train}\n"
      "train_cfg: {max_iters: " + std::to_string(max_iters) + "}\n"
      "optim_wrapper:\n  optimizer: {type: AdamW, lr: 0.002, betas: [0.9, 0.99], weight_decay: 0.05}\n";
  if (paramwise) yaml += "  paramwise_cfg: {norm_decay_mult: 0, bias_decay_mult: 0, bias_lr_mult: 2}\n";
  if (!clip.empty()) yaml += "  clip_grad: " + clip + "\n";
  yaml += "default_hooks:\n  logger: {interval: 5}\n  checkpoint: {interval: 10, by_epoch: false}\n";
  return yaml + strategy;
}

const std::string kDDP = "strategy: {type: DDPStrategy, launcher: pytorch, backend: gloo}\n";

std::string fsdp(bool use_orig_params) {
  return std::string("strategy:\n  type: FSDPStrategy\n  launcher: pytorch\n  backend: gloo\n  state_dict_type: full\n"
                     "  model_wrapper:\n    sharding_strategy: FULL_SHARD\n"
                     "    auto_wrap_policy: {type: size_based, min_num_params: 1000}\n") +
         (use_orig_params ? "    use_orig_params: true\n" : "");
}

// `lockstep train` on `nproc` ranks; `resume` continues from the newest checkpoint in `work_dir`.
testing::CommandResult train(const testing::TempDir& dir, const std::string& name, const std::string& yaml,
                             const std::string& work_dir, bool resume, int nproc = 2) {
  const std::string path = dir.file(name + ".yaml");
  testing::write_file(path, yaml);
  std::vector<std::string> argv{testing::lockstep_binary(), "train", path, "--work-dir", work_dir, "--nproc",
                                std::to_string(nproc)};
  if (resume) argv.push_back("--resume");
  return testing::run_command(argv, {}, 300);
}

void expect_same_weights(const std::string& a, const std::string& b, const std::string& what) {
  auto diff = testing::run_command({testing::lockstep_binary(), "ckpt", "diff", a, b, "--atol", "1e-6"});
  EXPECT_EQ(diff.exit_code, 0) << what << ":\n" << diff.output;
}

class CheckpointMove : public ::testing::TestWithParam<bool> {};

TEST_P(CheckpointMove, FsdpToDdpAndBackContinuesAsDdpAlone) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is missing";
  const bool paramwise = GetParam();
  const std::string fsdp_strategy = fsdp(/*use_orig_params=*/paramwise);
  testing::TempDir dir;

  auto alone = train(dir, "ddp20", config(20, kDDP, paramwise), dir.file("ddp_alone"), false);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const std::string reference = dir.file("ddp_alone/model_final.ckpt");

  // Ten iterations under `before`, then `after` resumes the full checkpoint and runs ten more.
  auto move = [&](const std::string& name, const std::string& before, const std::string& after) {
    SCOPED_TRACE(name);
    auto first = train(dir, name + "_first", config(10, before, paramwise), dir.file(name), false);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    auto second = train(dir, name + "_resumed", config(20, after, paramwise), dir.file(name), true);
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("Resuming from"), std::string::npos) << second.output;
    expect_same_weights(reference, dir.file(name + "/model_final.ckpt"), name);
  };
  move("fsdp_then_ddp", fsdp_strategy, kDDP);
  move("ddp_then_fsdp", kDDP, fsdp_strategy);  // the optimizer state is sharded on load
}

// With use_orig_params a sharded checkpoint (each rank's shards and the
// optimizer state of its parts of the parameters) resumes bitwise.
TEST(CheckpointMoveSharded, OrigParamsResumeBitwiseFromAShardedCheckpoint) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is missing";
  testing::TempDir dir;
  std::string strategy = fsdp(/*use_orig_params=*/true);
  strategy.replace(strategy.find("state_dict_type: full"), 21, "state_dict_type: sharded");
  auto alone = train(dir, "alone", config(20, strategy, true), dir.file("alone"), false);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  auto first = train(dir, "first", config(10, strategy, true), dir.file("resumed"), false);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = train(dir, "second", config(20, strategy, true), dir.file("resumed"), true);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("Resuming from"), std::string::npos) << second.output;
  auto diff = testing::run_command({testing::lockstep_binary(), "ckpt", "diff", dir.file("alone/model_final.ckpt"),
                                    dir.file("resumed/model_final.ckpt")});
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  EXPECT_NE(diff.output.find("bitwise equal"), std::string::npos) << diff.output;
}

// An elastic job that grew from 2 ranks to 3: the sharded checkpoint of 2
// ranks resumes on 3 (resharded on load) exactly as the full checkpoint of the
// same run does, and `lockstep ckpt export` makes one file of it equal to the
// full checkpoint's export. Both layouts of the optimizer state.
TEST_P(CheckpointMove, ShardedCheckpointOfTwoRanksResumesOnThreeAsTheFullOne) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is missing";
  const bool paramwise = GetParam();
  testing::TempDir dir;
  const std::string full = fsdp(/*use_orig_params=*/paramwise);
  std::string sharded = full;
  sharded.replace(sharded.find("state_dict_type: full"), 21, "state_dict_type: sharded");
  // Keeping one checkpoint: the older ones go with their shard files.
  auto keep_one = [](std::string yaml) {
    return yaml.replace(yaml.find("by_epoch: false}"), 16, "by_epoch: false, max_keep_ckpts: 1}");
  };
  for (const auto& [name, strategy] : {std::pair{"full", full}, std::pair{"sharded", sharded}}) {
    auto first = train(dir, std::string(name) + "_2", keep_one(config(10, strategy, paramwise)), dir.file(name), false);
    ASSERT_EQ(first.exit_code, 0) << first.output;
  }
  for (const char* name : {"full", "sharded"}) {
    auto exported = testing::export_checkpoint(dir.file(std::string(name) + "/model_final.ckpt"),
                                                dir.file(std::string(name) + "_10.safetensors"));
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
  }
  auto diff = testing::run_command({testing::lockstep_binary(), "ckpt", "diff", dir.file("full_10.safetensors"),
                                    dir.file("sharded_10.safetensors")});
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  EXPECT_NE(diff.output.find("bitwise equal"), std::string::npos) << diff.output;

  for (const auto& [name, strategy] : {std::pair{"full", full}, std::pair{"sharded", sharded}}) {
    auto resumed = train(dir, std::string(name) + "_3", keep_one(config(20, strategy, paramwise)), dir.file(name), true, 3);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("Resuming from"), std::string::npos) << resumed.output;
    if (std::string(name) == "sharded") {
      EXPECT_NE(resumed.output.find("(written by 2 rank(s), 2 per shard group) to 3 ranks"), std::string::npos)
          << resumed.output;
    }
  }
  diff = testing::run_command({testing::lockstep_binary(), "ckpt", "diff", dir.file("full/model_final.ckpt"),
                               dir.file("sharded/model_final.ckpt")});
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  EXPECT_NE(diff.output.find("bitwise equal"), std::string::npos) << diff.output;
  // Every shard file left belongs to a checkpoint that is still there.
  int shards = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("sharded"))) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".shard") continue;
    ++shards;
    EXPECT_TRUE(testing::file_exists(dir.file("sharded/" + name.substr(0, name.find(".rank")))))
        << name << " outlived its checkpoint";
  }
  EXPECT_GT(shards, 0);
}

// Clipping by the infinity norm over use_orig_params' parts of the shards,
// some of them empty on a rank (a parameter held wholly by the other rank),
// trains as DDP does.
TEST(CheckpointMoveClip, InfinityNormOverOrigParamsAsDdp) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is missing";
  testing::TempDir dir;
  const std::string clip = "{max_norm: 0.05, norm_type: .inf}";
  auto ddp = train(dir, "ddp", config(10, kDDP, true, clip), dir.file("ddp"), false);
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  auto fsdp_run = train(dir, "fsdp", config(10, fsdp(/*use_orig_params=*/true), true, clip), dir.file("fsdp"), false);
  ASSERT_EQ(fsdp_run.exit_code, 0) << fsdp_run.output;
  expect_same_weights(dir.file("ddp/model_final.ckpt"), dir.file("fsdp/model_final.ckpt"), "clip_grad inf norm");
}

// Per-parameter options over flat shards cannot be honoured: refused, naming
// the key and the switch that makes them work.
TEST(CheckpointMoveConfig, ParamwiseWithoutOrigParamsIsRefusedWithTheFix) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is missing";
  testing::TempDir dir;
  const std::string yaml = config(2, fsdp(/*use_orig_params=*/false), /*paramwise=*/true);
  auto run = train(dir, "flat", yaml, dir.file("work"), false);
  EXPECT_NE(run.exit_code, 0) << run.output;
  const auto line = 1 + std::count(yaml.begin(), yaml.begin() + static_cast<std::ptrdiff_t>(yaml.find("paramwise_cfg")), '\n');
  EXPECT_NE(run.output.find("flat.yaml:" + std::to_string(line) + " (key optim_wrapper.paramwise_cfg)"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("paramwise_cfg under FSDPStrategy needs strategy.model_wrapper.use_orig_params: true"),
            std::string::npos)
      << run.output;
}

INSTANTIATE_TEST_SUITE_P(Layouts, CheckpointMove, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("PerParameterGroups") : std::string("FlatShards");
                         });

}  // namespace
}  // namespace lockstep
