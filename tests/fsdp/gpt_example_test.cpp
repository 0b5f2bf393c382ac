// examples/gpt end to end, shrunk to a few iterations of a tiny model so the
// example cannot rot: 2 processes under the launcher, FSDP from the example's
// own YAML, the unigram entropy and a held-out loss printed, a sample
// generated on every rank, and a full checkpoint a single process can read.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "examples/gpt/fortunes.h"
#include "lockstep/checkpoint/checkpoint_file.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

constexpr const char* kFortunes = "/usr/share/games/fortunes";

double number_after(const std::string& output, const std::string& label) {
  std::smatch match;
  const std::regex pattern(label + " ([-+0-9.eE]+|nan|inf)");
  if (!std::regex_search(output, match, pattern)) return NAN;
  return std::stod(match[1]);
}

TEST(FsdpGptExample, CorpusIsCleanedSplitByFortuneAndMeasured) {
  // An overstrike keeps its last character, a tab is a space, other bytes go,
  // trailing blank lines too.
  EXPECT_EQ(gpt::clean("H\bHe_\bl\tlo\x01\xc3\xa9\n\n"), "Hel lo");
  EXPECT_EQ(gpt::decode(gpt::encode("Hi there\n~")), "Hi there\n~");
  EXPECT_EQ(gpt::encode("\n ~").equal(torch::tensor({0, 1, 95}, torch::kLong)), true);
  const std::vector<std::string> fortunes{"a", "b", "c", "d"};
  EXPECT_EQ(gpt::split_text(fortunes, "train", 2), "a\n%\nc\n%\n");
  EXPECT_EQ(gpt::split_text(fortunes, "val", 2), "b\n%\nd\n%\n");
  // -sum p ln p: two symbols, equally often, is ln 2; four is ln 4; one is 0.
  EXPECT_NEAR(gpt::unigram_entropy(gpt::encode("abab")), std::log(2.0), 1e-12);
  EXPECT_NEAR(gpt::unigram_entropy(gpt::encode("abcdabcd")), std::log(4.0), 1e-12);
  EXPECT_NEAR(gpt::unigram_entropy(gpt::encode("aaaa")), 0.0, 1e-12);
}

TEST(FsdpGptExample, TrainsAFewIterationsOnTwoRanks) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFortunes)) GTEST_SKIP() << kFortunes << " is missing (Debian package fortunes)";
  const std::string program = testing::binary_dir() + "/examples/gpt_fortunes";
  ASSERT_TRUE(testing::file_exists(program)) << program << " is not built (target gpt_fortunes)";
  testing::TempDir dir;
  std::vector<std::string> argv{testing::launcher_binary(), "run", "--standalone", "--nproc-per-node", "2", "--",
                                program, testing::source_dir() + "/examples/gpt/gpt_fsdp.yaml",
                                "--work-dir", dir.path(), "--sample-chars", "40"};
  for (const char* setting :
       {"train_cfg.max_iters=4", "train_cfg.val_interval=4", "model.n_layer=2", "model.n_embd=32", "model.n_head=2",
        "model.block_size=16", "train_dataloader.batch_size=4", "train_dataloader.dataset.block_size=16",
        "val_dataloader.dataset.block_size=16", "val_dataloader.dataset.val_every=400",
        "train_dataloader.dataset.val_every=400", "default_hooks.checkpoint.interval=4", "default_hooks.logger.interval=2",
        "param_scheduler=null"}) {
    argv.insert(argv.end(), {"--set", setting});
  }
  auto result = testing::run_command(argv, {}, 300);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string& out = result.output;
  // The entropy of English text in 96 characters: well above 0 (one symbol),
  // below log(96) = 4.56 (uniform).
  const double entropy = number_after(out, "unigram entropy");
  EXPECT_GT(entropy, 2.5) << out;
  EXPECT_LT(entropy, 4.0) << out;
  EXPECT_TRUE(std::isfinite(number_after(out, "held-out loss:"))) << out;
  EXPECT_NE(out.find("--- sample ---"), std::string::npos) << out;
  EXPECT_NE(out.find("FSDP FULL_SHARD: 3 unit(s) over 2 rank(s)"), std::string::npos) << out;  // 2 blocks + root
  State checkpoint = read_checkpoint_file(dir.file("model_final.ckpt"));
  const auto& weights = checkpoint.get("model").tensors;
  ASSERT_TRUE(weights.count("tok_emb.weight")) << "a full checkpoint holds every parameter";
  EXPECT_EQ(weights.at("tok_emb.weight").sizes(), (std::vector<int64_t>{96, 32}));
}

// Activation checkpointing of the GPT's blocks on 2 ranks, with residual
// dropout: the weights after 6 steps equal those of the same run without it,
// bitwise, under DDP (with and without static_graph) and under FSDP
// (FULL_SHARD and SHARD_GRAD_OP).
TEST(GptActivationCheckpointing, DdpAndFsdpTrainBitwiseAsWithoutIt) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFortunes)) GTEST_SKIP() << kFortunes << " is missing (Debian package fortunes)";
  const std::string program = testing::binary_dir() + "/examples/gpt_fortunes";
  testing::TempDir dir;
  auto train = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> argv{testing::launcher_binary(), "run", "--standalone", "--nproc-per-node", "2", "--",
                                  program, testing::source_dir() + "/examples/gpt/gpt_fsdp.yaml",
                                  "--work-dir", dir.file(name), "--sample-chars", "10"};
    for (const char* setting :
         {"train_cfg.max_iters=6", "train_cfg.val_interval=6", "model.n_layer=2", "model.n_embd=32", "model.n_head=2",
          "model.dropout=0.1", "model.block_size=16", "train_dataloader.batch_size=4",
          "train_dataloader.dataset.block_size=16", "val_dataloader.dataset.block_size=16",
          "val_dataloader.dataset.val_every=400", "train_dataloader.dataset.val_every=400",
          "default_hooks.checkpoint.interval=6", "param_scheduler=null"}) {
      argv.insert(argv.end(), {"--set", setting});
    }
    for (const auto& setting : extra) argv.insert(argv.end(), {"--set", setting});
    return testing::run_command(argv, {}, 300);
  };
  for (const char* static_graph : {"false", "true"}) {
    const std::string ddp = std::string("strategy={_delete_: true, type: DDPStrategy, launcher: pytorch, backend: gloo, "
                                        "model_wrapper: {type: MMDistributedDataParallel, static_graph: ") + static_graph + "}}";
    const std::string plain = std::string("plain_") + static_graph, checkpointed = std::string("checkpointed_") + static_graph;
    auto a = train(plain, {ddp});
    ASSERT_EQ(a.exit_code, 0) << a.output;
    auto b = train(checkpointed, {ddp, "activation_checkpointing={module_types: [Block]}"});
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("Activation checkpointing: 2 module(s)"), std::string::npos) << b.output;
    auto diff = testing::run_command({testing::lockstep_binary(), "ckpt", "diff", dir.file(plain + "/model_final.ckpt"),
                                      dir.file(checkpointed + "/model_final.ckpt")});
    EXPECT_EQ(diff.exit_code, 0) << "static_graph " << static_graph << ": " << diff.output;
    EXPECT_NE(diff.output.find("bitwise equal"), std::string::npos) << diff.output;
  }
  // FSDP: the blocks are units; each recomputes inside its unit's scope,
  // after the unit's pre-backward gathered its parameters again.
  for (const char* sharding : {"FULL_SHARD", "SHARD_GRAD_OP"}) {
    const std::string strategy = std::string("strategy.model_wrapper.sharding_strategy=") + sharding;
    const std::string plain = std::string("fsdp_plain_") + sharding, checkpointed = std::string("fsdp_checkpointed_") + sharding;
    auto a = train(plain, {strategy});
    ASSERT_EQ(a.exit_code, 0) << a.output;
    auto b = train(checkpointed, {strategy, "activation_checkpointing={module_types: [Block]}"});
    ASSERT_EQ(b.exit_code, 0) << b.output;
    auto diff = testing::run_command({testing::lockstep_binary(), "ckpt", "diff", dir.file(plain + "/model_final.ckpt"),
                                      dir.file(checkpointed + "/model_final.ckpt")});
    EXPECT_EQ(diff.exit_code, 0) << sharding << ": " << diff.output;
    EXPECT_NE(diff.output.find("bitwise equal"), std::string::npos) << diff.output;
  }
}

}  // namespace
}  // namespace lockstep
