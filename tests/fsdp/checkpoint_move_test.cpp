// A full checkpoint moves between FSDP and DDP on the user's path: `lockstep
// train` stops at iteration 10 under one strategy, `lockstep train --resume`
// carries on to 20 under the other (model, AdamW state with per-parameter
// groups, trainer state), and the result equals 20 iterations under DDP
// alone. Both directions, with paramwise_cfg (FSDP's use_orig_params) and with
// FSDP's default flat shards. And a sharded checkpoint with use_orig_params
// resumes bitwise, and a DCP one of 2 ranks on 3, and under DDP.
//
// Two-rank FSDP trains the same bits as DDP (the differential suite's
// FSDP_AdamW_Paramwise came out bitwise), so the comparison allows only 1e-6: an
// optimizer state lost or misplaced on the way moves weights by about the
// learning rate (2e-3) in the first step after the move.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

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

// `strategy` (fsdp()'s) saving with state_dict_type `type` (and its further keys).
std::string saving(std::string strategy, const std::string& type) {
  return strategy.replace(strategy.find("state_dict_type: full"), 21, "state_dict_type: " + type);
}
// fsdp()'s strategy with FullyShard's per-parameter shards.
std::string fully_shard() {
  std::string strategy = fsdp(/*use_orig_params=*/false);
  return strategy.replace(strategy.find("sharding_strategy: FULL_SHARD"), 29, "type: FullyShard");
}

// `lockstep train` on `nproc` ranks; `resume` continues from the newest checkpoint in `work_dir`.
testing::CommandResult train(const testing::TempDir& dir, const std::string& name, const std::string& yaml,
                             const std::string& work_dir, bool resume, int nproc = 2,
                             const std::vector<std::string>& env = {}) {
  const std::string path = dir.file(name + ".yaml");
  testing::write_file(path, yaml);
  std::vector<std::string> argv{testing::lockstep_binary(), "train", path, "--work-dir", work_dir, "--nproc",
                                std::to_string(nproc)};
  if (resume) argv.push_back("--resume");
  return testing::run_command(argv, env, 300);
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
  const std::string strategy = saving(fsdp(/*use_orig_params=*/true), "sharded");
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

// Keeping one periodic checkpoint: the older ones go with their shard files or directories.
std::string keep_one(std::string yaml) {
  return yaml.replace(yaml.find("by_epoch: false}"), 16, "by_epoch: false, max_keep_ckpts: 1}");
}

void expect_bitwise_equal(const std::string& a, const std::string& b) {
  auto diff = testing::run_command({testing::lockstep_binary(), "ckpt", "diff", a, b});
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  EXPECT_NE(diff.output.find("bitwise equal"), std::string::npos) << diff.output;
}

// 10 iterations on 2 ranks saving with `full` (into dir/full) and with
// `other` (into dir/<name>), whose exports must be bitwise equal; then both
// resume on 3 ranks to iteration 20, again bitwise equal. Returns the output
// of `other`'s resumed run. `edit` changes each config (keep_one by default).
std::string resume_on_three_as_the_full_one(const testing::TempDir& dir, const std::string& full,
                                            const std::string& name, const std::string& other, bool paramwise,
                                            const std::function<std::string(std::string)>& edit = keep_one) {
  const std::vector<std::pair<std::string, std::string>> runs{{"full", full}, {name, other}};
  for (const auto& [run, strategy] : runs) {
    auto first = train(dir, run + "_2", edit(config(10, strategy, paramwise)), dir.file(run), false);
    EXPECT_EQ(first.exit_code, 0) << first.output;
    auto exported = testing::export_checkpoint(dir.file(run + "/model_final.ckpt"), dir.file(run + "_10.safetensors"));
    EXPECT_EQ(exported.exit_code, 0) << exported.output;
  }
  expect_bitwise_equal(dir.file("full_10.safetensors"), dir.file(name + "_10.safetensors"));
  std::string output;
  for (const auto& [run, strategy] : runs) {
    auto resumed = train(dir, run + "_3", edit(config(20, strategy, paramwise)), dir.file(run), true, 3);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("Resuming from"), std::string::npos) << resumed.output;
    output = resumed.output;
  }
  expect_bitwise_equal(dir.file("full/model_final.ckpt"), dir.file(name + "/model_final.ckpt"));
  return output;
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
  const std::string resumed = resume_on_three_as_the_full_one(dir, full, "sharded", saving(full, "sharded"), paramwise);
  EXPECT_NE(resumed.find("(written by 2 rank(s), 2 per shard group) to 3 ranks"), std::string::npos) << resumed;
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

// state_dict_type: dcp, PyTorch's distributed checkpoint (whose layout
// tests/differential/dcp_train_test.cpp holds to PyTorch 2.14's own): of 2
// ranks, it resumes on 3 exactly as the full checkpoint of the same run does,
// each rank reading only the boxes that overlap its elements. Under FSDP1
// (use_orig_params) a flat shard cuts parameters mid-row, so a rank's part is
// several boxes; under FullyShard it is whole rows. paramwise_cfg's groups,
// BatchNorm's buffers (int64 num_batches_tracked among them), and
// max_keep_ckpts removing the older directories with their manifests.
class DcpCheckpointMove : public ::testing::TestWithParam<std::string> {};

TEST_P(DcpCheckpointMove, OfTwoRanksResumesOnThreeAsTheFullOne) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is missing";
  testing::TempDir dir;
  const std::string full = GetParam() == "FSDP" ? fsdp(/*use_orig_params=*/true) : fully_shard();
  // FullyShardFrozen: a frozen first conv of 4 channels, so at 3 ranks its
  // unit holds nothing on rank 2, which must still refresh with the others.
  auto edit = [frozen = GetParam() == "FullyShardFrozen"](std::string yaml) {
    if (!frozen) return keep_one(yaml);
    yaml.replace(yaml.find("channels: [8, 16]"), 17, "channels: [4, 16]");
    return keep_one(yaml.replace(yaml.find("  batch_norm: true\n"), 19,
                                 "  batch_norm: true\n  frozen_parameters: [features.0]\n"));
  };
  resume_on_three_as_the_full_one(dir, full, "dcp", saving(full, "dcp"), /*paramwise=*/true, edit);
  // Its weights load anywhere: DDP starts from them (strict: every name must match).
  auto ddp = train(dir, "ddp_from_dcp",
                   edit(config(1, kDDP, true)) + "load_from: {path: " + dir.file("dcp/model_final.ckpt") + ", strict: true}\n",
                   dir.file("ddp_from_dcp"), false);
  EXPECT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_TRUE(testing::file_exists(dir.file("dcp/model_final.dcp/__2_0.distcp")));
  // Every DCP directory left belongs to a checkpoint that is still there.
  int directories = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("dcp"))) {
    if (entry.path().extension() != ".dcp") continue;
    ++directories;
    EXPECT_TRUE(testing::file_exists(std::filesystem::path(entry.path()).replace_extension(".ckpt").string()))
        << entry.path() << " outlived its checkpoint";
  }
  EXPECT_EQ(directories, 2) << "model_final and the newest periodic checkpoint";
}

// async_save: the DCP checkpoint is written on a thread of its own while
// training goes on (Note [Saving in the background]). Uninterrupted, the run
// ends where the run saving in the foreground ends. Rank 1 SIGKILLed while
// its thread writes the second checkpoint: that one never becomes whole,
// the first is kept (max_keep_ckpts: 1 removes it only once its successor
// is whole), and the restarted job resumes from it to the same bits.
TEST(DcpAsyncSave, KilledWhileWritingInTheBackgroundResumesBitwiseFromThePreviousCheckpoint) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is missing";
  testing::TempDir dir;
  const std::string dcp = saving(fully_shard(), "dcp");
  const std::string async = saving(fully_shard(), "dcp\n  async_save: true");
  auto every_five = [](std::string yaml) {
    return yaml.replace(yaml.find("interval: 10, by_epoch: false}"), 30, "interval: 5, by_epoch: false, max_keep_ckpts: 1}");
  };
  auto foreground = train(dir, "foreground", every_five(config(20, dcp, true)), dir.file("foreground"), false);
  ASSERT_EQ(foreground.exit_code, 0) << foreground.output;
  auto background = train(dir, "background", every_five(config(20, async, true)), dir.file("background"), false);
  ASSERT_EQ(background.exit_code, 0) << background.output;
  expect_bitwise_equal(dir.file("foreground/model_final.ckpt"), dir.file("background/model_final.ckpt"));

  // Rank 1 writes 36 boxes per checkpoint (12 parameters, each with exp_avg
  // and exp_avg_sq): the 40th write is in the second checkpoint's file.
  auto killed = train(dir, "killed", every_five(config(20, async, true)), dir.file("killed"), false, 2,
                      {"LOCKSTEP_FAULT_KILL_AT=write:__1_0.distcp@40", "LOCKSTEP_FAULT_RANK=1"});
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("reached fault point 'write:__1_0.distcp'"), std::string::npos) << killed.output;
  EXPECT_EQ(testing::read_file(dir.file("killed/last_checkpoint")), "model_0000004.ckpt");
  EXPECT_TRUE(testing::file_exists(dir.file("killed/model_0000004.dcp/.metadata")));
  EXPECT_FALSE(testing::file_exists(dir.file("killed/model_0000009.ckpt")));
  EXPECT_FALSE(testing::file_exists(dir.file("killed/model_0000009.dcp/.metadata")));
  auto resumed = train(dir, "resumed", every_five(config(20, async, true)), dir.file("killed"), true);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("Resuming from " + dir.file("killed/model_0000004.ckpt")), std::string::npos)
      << resumed.output;
  expect_bitwise_equal(dir.file("foreground/model_final.ckpt"), dir.file("killed/model_final.ckpt"));
}

// DDP resumes from a DCP checkpoint, as PyTorch's dcp.load reads one into a
// DDP model (Note [A whole model from DCP]): a FullyShard run saves with
// state_dict_type: dcp at iteration 10, and DDP carries on to 20 from its
// manifest (trainer state and all), and from the bare directory, as from one
// PyTorch wrote (`load_from: <dir>` with `resume: true`: the iteration from
// the optimizer's step count, Note [Resuming from PyTorch's DCP]); both end
// where 20 iterations under DDP alone end.
TEST(DcpToDdp, DdpResumesFromTheManifestAndFromTheBareDirectoryAsDdpAlone) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is missing";
  testing::TempDir dir;
  auto alone = train(dir, "ddp20", config(20, kDDP, true), dir.file("ddp_alone"), false);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  auto first = train(dir, "dcp10", config(10, saving(fully_shard(), "dcp"), true), dir.file("manifest"), false);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::filesystem::copy(dir.file("manifest/model_final.dcp"), dir.file("bare.dcp"));

  auto from_manifest = train(dir, "manifest20", config(20, kDDP, true), dir.file("manifest"), true);
  ASSERT_EQ(from_manifest.exit_code, 0) << from_manifest.output;
  EXPECT_NE(from_manifest.output.find("Resuming from " + dir.file("manifest/model_final.ckpt")), std::string::npos)
      << from_manifest.output;
  expect_same_weights(dir.file("ddp_alone/model_final.ckpt"), dir.file("manifest/model_final.ckpt"), "manifest");

  auto from_directory = train(dir, "bare20", config(20, kDDP, true) + "load_from: " + dir.file("bare.dcp") + "\n",
                              dir.file("bare"), true);
  ASSERT_EQ(from_directory.exit_code, 0) << from_directory.output;
  EXPECT_NE(from_directory.output.find("the optimizer has taken 10 step(s), so training goes on at iteration 10"),
            std::string::npos)
      << from_directory.output;
  expect_same_weights(dir.file("ddp_alone/model_final.ckpt"), dir.file("bare/model_final.ckpt"), "bare directory");
}

INSTANTIATE_TEST_SUITE_P(Wrappers, DcpCheckpointMove, ::testing::Values("FSDP", "FullyShard", "FullyShardFrozen"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

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
