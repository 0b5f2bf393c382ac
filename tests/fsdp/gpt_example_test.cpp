// examples/gpt end to end, shrunk to a few iterations of a tiny model so the
// example cannot rot: 2 processes under the launcher, FSDP from the example's
// own YAML, the unigram entropy and a held-out loss printed, a sample
// generated on every rank, and a full checkpoint a single process can read.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "examples/gpt/fortunes.h"
#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/checkpoint/pretrained.h"
#include "tests/support/multiprocess.h"
#include "tests/support/small_job.h"
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
  // The runner built the GPT through FSDPStrategy: its blocks were sharded as they were built.
  EXPECT_NE(out.find("2 sharded while the model was built"), std::string::npos) << out;
  State checkpoint = read_checkpoint_file(dir.file("model_final.ckpt"));
  const auto& weights = checkpoint.get("model").tensors;
  ASSERT_TRUE(weights.count("tok_emb.weight")) << "a full checkpoint holds every parameter";
  EXPECT_EQ(weights.at("tok_emb.weight").sizes(), (std::vector<int64_t>{96, 32}));
}

// examples/gpt/gpt_lora_fsdp2.yaml end to end, shrunk: a base trained for 4
// iterations under FSDP (gpt_fsdp.yaml), then LoRA-fine-tuned from its final
// checkpoint for 4 under FullyShard on 2 ranks, its base in bf16 beside fp32
// adapters. The fine-tune's checkpoint holds the base's weights in bf16,
// bitwise their cast (frozen, sharded with their blocks, never stepped), and
// fp32 adapters that left their zero start.
TEST(FsdpGptExample, LoraFineTunesAFrozenBaseUnderFullyShard) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFortunes)) GTEST_SKIP() << kFortunes << " is missing (Debian package fortunes)";
  const std::string program = testing::binary_dir() + "/examples/gpt_fortunes";
  testing::TempDir dir;
  auto train = [&](const std::string& yaml, const std::string& work, const std::vector<std::string>& extra) {
    std::vector<std::string> argv{testing::launcher_binary(), "run", "--standalone", "--nproc-per-node", "2", "--",
                                  program, testing::source_dir() + "/examples/gpt/" + yaml,
                                  "--work-dir", dir.file(work), "--sample-chars", "10"};
    std::vector<std::string> settings{
        "train_cfg.max_iters=4", "train_cfg.val_interval=4", "model.n_layer=2", "model.n_embd=32", "model.n_head=2",
        "model.block_size=16", "train_dataloader.batch_size=4", "train_dataloader.dataset.block_size=16",
        "val_dataloader.dataset.block_size=16", "val_dataloader.dataset.val_every=400",
        "train_dataloader.dataset.val_every=400", "default_hooks.checkpoint.interval=4", "param_scheduler=null"};
    settings.insert(settings.end(), extra.begin(), extra.end());
    for (const auto& setting : settings) argv.insert(argv.end(), {"--set", setting});
    return testing::run_command(argv, {}, 300);
  };
  auto base = train("gpt_fsdp.yaml", "base", {});
  ASSERT_EQ(base.exit_code, 0) << base.output;
  auto tuned = train("gpt_lora_fsdp2.yaml", "lora", {"load_from.path=" + dir.file("base/model_final.ckpt")});
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("(FullyShard, per-parameter)"), std::string::npos) << tuned.output;
  EXPECT_TRUE(std::isfinite(number_after(tuned.output, "held-out loss:"))) << tuned.output;
  const auto base_weights = testing::checkpoint_weights(dir.file("base/model_final.ckpt"));
  const auto tuned_weights = testing::checkpoint_weights(dir.file("lora/model_final.ckpt"));
  int adapters = 0;
  bool moved = false;
  for (const auto& [name, value] : tuned_weights) {
    if (name.find("_lora_") != std::string::npos) {
      ++adapters;
      EXPECT_EQ(value.scalar_type(), torch::kFloat) << name;
      if (name.find("_lora_b") != std::string::npos) moved = moved || value.abs().max().item<double>() > 0;
      continue;
    }
    ASSERT_TRUE(base_weights.count(name)) << name;
    EXPECT_EQ(value.scalar_type(), torch::kBFloat16) << name << ": lora_base_dtype: bf16";
    EXPECT_TRUE(torch::equal(value, base_weights.at(name).to(torch::kBFloat16))) << name << ": a frozen base weight changed";
  }
  EXPECT_EQ(adapters, 8) << "A and B for qkv and proj in each of 2 blocks";
  EXPECT_TRUE(moved) << "no adapter left zero: LoRA did not train";
  // The same run saved as PyTorch's DCP: each block's bf16 base and fp32
  // adapters, from the unit and its companion, under their own names and dtypes.
  auto as_dcp = train("gpt_lora_fsdp2.yaml", "lora_dcp",
                      {"load_from.path=" + dir.file("base/model_final.ckpt"), "strategy.state_dict_type=dcp"});
  ASSERT_EQ(as_dcp.exit_code, 0) << as_dcp.output;
  const auto saved = read_dcp_state_dict(dir.file("lora_dcp/model_final.dcp"));
  for (const auto& [name, value] : tuned_weights) {
    ASSERT_TRUE(saved.count("model." + name)) << name;
    EXPECT_EQ(saved.at("model." + name).scalar_type(), value.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(saved.at("model." + name), value)) << name << ": DCP and the full checkpoint differ";
  }
}

// Activation checkpointing of the GPT's blocks on 2 ranks, with residual
// dropout: the weights after 6 steps equal those of the same run without it,
// bitwise, under DDP (with and without static_graph) and under FSDP
// (FULL_SHARD and SHARD_GRAD_OP). One run without it serves each strategy:
// on 2 ranks static_graph and SHARD_GRAD_OP train the same bits as DDP and
// FULL_SHARD do (each gradient element is the one sum a + b, the optimizer
// step the same), so each run with it is compared with that one run, a claim
// at least as strong as against its own twin, in 6 jobs rather than 8.
void expect_same_model_bitwise(const std::string& a, const std::string& b, const std::string& what) {
  const auto weights = testing::checkpoint_weights(a);
  EXPECT_EQ(weights.size(), 30u) << what << ": every parameter of the 2-block GPT";
  EXPECT_TRUE(testing::bitwise_equal(weights, testing::checkpoint_weights(b))) << what;
}

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
  const auto ddp = [](const std::string& static_graph) {
    return "strategy={_delete_: true, type: DDPStrategy, launcher: pytorch, backend: gloo, "
           "model_wrapper: {type: MMDistributedDataParallel, static_graph: " + static_graph + "}}";
  };
  auto plain = train("plain", {ddp("false")});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  for (const std::string static_graph : {"false", "true"}) {
    const std::string checkpointed = "checkpointed_" + static_graph;
    auto b = train(checkpointed, {ddp(static_graph), "activation_checkpointing={module_types: [Block]}"});
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("Activation checkpointing: 2 module(s)"), std::string::npos) << b.output;
    expect_same_model_bitwise(dir.file("plain/model_final.ckpt"), dir.file(checkpointed + "/model_final.ckpt"),
                              "DDP, static_graph " + static_graph);
  }
  // FSDP: the blocks are units; each recomputes inside its unit's scope,
  // after the unit's pre-backward gathered its parameters again.
  auto fsdp_plain = train("fsdp_plain", {"strategy.model_wrapper.sharding_strategy=FULL_SHARD"});
  ASSERT_EQ(fsdp_plain.exit_code, 0) << fsdp_plain.output;
  for (const std::string sharding : {"FULL_SHARD", "SHARD_GRAD_OP"}) {
    const std::string checkpointed = "fsdp_checkpointed_" + sharding;
    auto b = train(checkpointed, {"strategy.model_wrapper.sharding_strategy=" + sharding,
                                  "activation_checkpointing={module_types: [Block]}"});
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("Activation checkpointing: 2 module(s)"), std::string::npos) << b.output;
    expect_same_model_bitwise(dir.file("fsdp_plain/model_final.ckpt"), dir.file(checkpointed + "/model_final.ckpt"),
                              "FSDP " + sharding);
  }
}

// EMAHook under FSDP: each rank averages its shards; the checkpoint holds
// the full averaged model, equal to the one DDP's EMA gives (within the FSDP
// tolerance of the differential tests), and validation uses it on both.
TEST(GptEma, FsdpAveragesItsShardsLikeDdpAveragesTheModel) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  if (!std::filesystem::is_directory(kFortunes)) GTEST_SKIP() << kFortunes << " is missing (Debian package fortunes)";
  const std::string program = testing::binary_dir() + "/examples/gpt_fortunes";
  testing::TempDir dir;
  auto train = [&](const std::string& name, std::vector<std::string> extra, bool resume = false) {
    std::vector<std::string> argv{testing::launcher_binary(), "run", "--standalone", "--nproc-per-node", "2", "--",
                                  program, testing::source_dir() + "/examples/gpt/gpt_fsdp.yaml",
                                  "--work-dir", dir.file(name), "--sample-chars", "10"};
    if (resume) argv.push_back("--resume");
    for (const char* setting :
         {"train_cfg.max_iters=8", "train_cfg.val_interval=8", "model.n_layer=2", "model.n_embd=32", "model.n_head=2",
          "model.block_size=16", "train_dataloader.batch_size=4", "train_dataloader.dataset.block_size=16",
          "val_dataloader.dataset.block_size=16", "val_dataloader.dataset.val_every=400",
          "train_dataloader.dataset.val_every=400", "default_hooks.checkpoint.interval=4",
          "default_hooks.checkpoint.max_keep_ckpts=2", "param_scheduler=null",
          "custom_hooks=[{type: EMAHook, momentum: 0.2, begin_iter: 2}]"}) {
      argv.insert(argv.end(), {"--set", setting});
    }
    for (const auto& setting : extra) argv.insert(argv.end(), {"--set", setting});
    return testing::run_command(argv, {}, 300);
  };
  auto fsdp = train("fsdp", {});
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.output;
  auto ddp = train("ddp", {"strategy={_delete_: true, type: DDPStrategy, launcher: pytorch, backend: gloo}"});
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  const auto fsdp_state = read_checkpoint_file(dir.file("fsdp/model_final.ckpt")).get("trainer").get("hooks").get("EMAHook");
  const auto ddp_state = read_checkpoint_file(dir.file("ddp/model_final.ckpt")).get("trainer").get("hooks").get("EMAHook");
  int compared = 0;
  for (const auto& [name, tensor] : ddp_state.tensors) {
    ASSERT_EQ(name.rfind("param/", 0), 0u) << name;
    const std::string full = "full/" + name.substr(6);
    ASSERT_TRUE(fsdp_state.tensors.count(full)) << full;
    const torch::Tensor& other = fsdp_state.tensors.at(full);
    const double scale = tensor.abs().max().item<double>() + 1e-12;
    EXPECT_LT((other - tensor).abs().max().item<double>() / scale, 1e-5) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 30);  // every parameter of the 2-block GPT
  // `ckpt export --ema` writes that average as the model's weights.
  auto exported = testing::export_checkpoint(dir.file("fsdp/model_final.ckpt"), dir.file("ema.safetensors"), {"--ema"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const auto ema_weights = read_model_weights(dir.file("ema.safetensors"));
  EXPECT_EQ(ema_weights.size(), 30u);
  for (const auto& [name, tensor] : ema_weights) {
    EXPECT_TRUE(torch::equal(tensor, fsdp_state.tensors.at("full/" + name))) << name;
  }
  // The held-out loss is the EMA model's on both.
  const double fsdp_loss = number_after(fsdp.output, "held-out loss:"), ddp_loss = number_after(ddp.output, "held-out loss:");
  EXPECT_NEAR(fsdp_loss, ddp_loss, 1e-4) << fsdp.output;
  auto plain = train("plain", {"custom_hooks=[]"});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_GT(std::abs(number_after(plain.output, "held-out loss:") - fsdp_loss), 1e-4) << "validation should use the average";

  // Resumed from iteration 4's checkpoint, FSDP's average ends bitwise where
  // the uninterrupted run's did.
  std::filesystem::create_directories(dir.file("resumed"));
  std::filesystem::copy_file(dir.file("fsdp/model_0000003.ckpt"), dir.file("resumed/model_0000003.ckpt"));
  testing::write_file(dir.file("resumed/last_checkpoint"), "model_0000003.ckpt");
  auto resumed = train("resumed", {}, /*resume=*/true);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto resumed_state =
      read_checkpoint_file(dir.file("resumed/model_final.ckpt")).get("trainer").get("hooks").get("EMAHook");
  ASSERT_EQ(resumed_state.tensors.size(), fsdp_state.tensors.size());
  for (const auto& [name, tensor] : fsdp_state.tensors) {
    EXPECT_TRUE(torch::equal(tensor, resumed_state.tensors.at(name))) << name << " differs after resume";
  }
  EXPECT_EQ(resumed_state.values.at("steps"), fsdp_state.values.at("steps"));
}

}  // namespace
}  // namespace lockstep
