// TorchScriptModel against Debian's python3-torch: a CNN scripted in Python
// gives the same logits, the same state-dict names and the same SGD step in
// lockstep; it trains through `lockstep train` on 2 ranks with DDP (and
// resumes bitwise) and with FSDP as one unit (the weights DDP trains); what
// lockstep saves torch.jit.load reads.
#include "lockstep/builtin_models/torchscript_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "lockstep/amp/autocast.h"
#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/optim/optim_wrapper.h"
#include "lockstep/strategy/strategy.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::lockstep::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

class TorchScriptModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::python_has("torch")) GTEST_SKIP() << "no python3-torch";
    // export_scripted_cnn.py beside this file: cnn.pt, and io.pt, PyTorch's run of it.
    auto result = testing::run_command(
        {testing::python(), testing::source_dir() + "/tests/tools/export_scripted_cnn.py", dir_.path()}, {}, 120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    python_keys_ = result.output.substr(0, result.output.find('\n'));
    io_ = read_pt_state_dict(dir_.file("io.pt"));
  }
  // A 2-rank DDP run of cnn.pt on synthetic 8x8 images, 6 iterations.
  std::string config(const std::string& optimizer) const {
    return "randomness: {seed: 0}\nmodel:\n  type: TorchScriptModel\n  path: " + dir_.file("cnn.pt") +
           "\n  data_preprocessor: {type: ImgDataPreprocessor, mean: [127.5], std: [127.5]}\n"
           "strategy: {type: DDPStrategy}\ntrain_dataloader:\n  batch_size: 6\n"
           "  sampler: {type: DefaultSampler, shuffle: true}\n"
           "  dataset: {type: SyntheticImages, size: 48, channels: 1, height: 8, width: 8, num_classes: 5, seed: 1}\n"
           "train_cfg: {max_iters: 6}\noptim_wrapper: {optimizer: " +
           optimizer + "}\n";
  }
  testing::TempDir dir_;
  std::string python_keys_;
  std::map<std::string, torch::Tensor> io_;
};

TEST_F(TorchScriptModelTest, SameNamesAndLogitsAsPython) {
  TorchScriptModel model(TorchScriptModelOptions().path(dir_.file("cnn.pt")));
  std::string keys;
  for (const auto& item : model.named_parameters()) keys += (keys.empty() ? "" : " ") + item.key();
  std::string all;
  // Python's state_dict() order: each module's parameters, then its buffers, depth first.
  for (const auto& name : {"features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
                           "features.1.running_mean", "features.1.running_var", "features.1.num_batches_tracked",
                           "head.weight", "head.bias"}) {
    all += (all.empty() ? "" : " ") + std::string(name);
  }
  EXPECT_EQ(python_keys_, all);
  EXPECT_EQ(keys, "features.0.weight features.0.bias features.1.weight features.1.bias head.weight head.bias");
  EXPECT_EQ(model.named_buffers().size(), 3u);
  model.eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model.predict(Batch{{"image", io_.at("x")}}).at("logits"), io_.at("eval_logits")));
}

TEST_F(TorchScriptModelTest, OneSgdStepMatchesPythonsIncludingBatchNormStatistics) {
  auto model = std::make_shared<TorchScriptModel>(TorchScriptModelOptions().path(dir_.file("cnn.pt")));
  OptimWrapper optim(std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1)));
  optim.initialize_count_status(0, 1);
  model->train_step(Batch{{"image", io_.at("x")}, {"label", io_.at("y")}}, optim);
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::allclose(item.value(), io_.at("after." + item.key()), 0, 1e-6)) << item.key();
  }
  for (const auto& item : model->named_buffers()) {
    EXPECT_TRUE(torch::allclose(item.value().to(torch::kDouble), io_.at("after." + item.key()).to(torch::kDouble), 0,
                                1e-6))
        << item.key();
  }
}

// mixed precision reaches inside the scripted module: under lockstep's
// autocast its convolutions and linear layers run in bfloat16, as Python's do
// under torch.autocast.
TEST_F(TorchScriptModelTest, AutocastReachesInsideTheScriptedModule) {
  TorchScriptModel model(TorchScriptModelOptions().path(dir_.file("cnn.pt")));
  for (int call = 0; call < 3; ++call) {  // the profiling executor specialises after the first calls
    AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16);
    EXPECT_EQ(model.forward(io_.at("x")).scalar_type(), torch::kBFloat16) << "call " << call;
  }
  EXPECT_EQ(model.forward(io_.at("x")).scalar_type(), torch::kFloat);
}

TEST_F(TorchScriptModelTest, ALossMethodOfTheModuleGivesTheLosses) {
  TorchScriptModel model(TorchScriptModelOptions().path(dir_.file("cnn.pt")).loss_method("compute_loss"));
  LossDict losses = model.loss(Batch{{"image", io_.at("x")}, {"label", io_.at("y")}});
  ASSERT_TRUE(losses.contains("loss_ce"));
  EXPECT_GT(losses["loss_ce"].item<double>(), 0);
  EXPECT_THAT(error_of([&] { TorchScriptModel(TorchScriptModelOptions().path(dir_.file("cnn.pt")).loss_method("nope")); }),
              AllOf(HasSubstr("'nope' is not a method"), HasSubstr("compute_loss")));
}

TEST_F(TorchScriptModelTest, WhatItSavesTorchJitLoadReadsWithTheTrainedWeights) {
  TorchScriptModel model(TorchScriptModelOptions().path(dir_.file("cnn.pt")));
  {
    torch::NoGradGuard no_grad;
    for (auto& parameter : model.parameters()) parameter.mul_(0.5);
  }
  model.eval();
  torch::Tensor ours = model.forward(io_.at("x")).detach();
  model.save_torchscript(dir_.file("trained.pt"));
  write_pt_state_dict({{"x", io_.at("x")}, {"logits", ours}}, dir_.file("ours.pt"));
  testing::write_file(dir_.file("check.py"), "import sys, torch\nm = torch.jit.load(sys.argv[1] + '/trained.pt')\n"
                      "m.eval()\nd = torch.load(sys.argv[1] + '/ours.pt', weights_only=True)\n"
                      "print('equal' if torch.equal(m(d['x']), d['logits']) else 'different')\n");
  auto result = testing::run_command({testing::python(), dir_.file("check.py"), dir_.path()}, {}, 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("equal"));
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr("different")));
}

TEST_F(TorchScriptModelTest, ATorchSaveFileIsNotAModule) {
  EXPECT_THAT(error_of([&] { TorchScriptModel(TorchScriptModelOptions().path(dir_.file("io.pt"))); }),
              AllOf(HasSubstr("io.pt: not a TorchScript module"), HasSubstr("load_from")));
  EXPECT_THAT(error_of([&] { TorchScriptModel(TorchScriptModelOptions().path(dir_.file("missing.pt"))); }),
              HasSubstr("missing.pt"));
}

TEST_F(TorchScriptModelTest, TrainsWithDdpOnTwoRanksThroughLockstepTrain) {
  testing::write_file(dir_.file("ddp.yaml"), config("{type: SGD, lr: 0.05}") +
                                                "default_hooks:\n  checkpoint: {interval: 3, by_epoch: false}\n");
  auto run = testing::run_command({testing::lockstep_binary(), "train", dir_.file("ddp.yaml"), "--nproc", "2",
                                   "--work-dir", dir_.file("ddp")},
                                  {}, 300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  State final_state = read_checkpoint_file(dir_.file("ddp/model_final.ckpt"));
  EXPECT_EQ(final_state.tensors.count("model/features.1.running_mean"), 1u);
  EXPECT_FALSE(torch::equal(final_state.tensors.at("model/head.weight"),
                            TorchScriptModel(TorchScriptModelOptions().path(dir_.file("cnn.pt")))
                                .named_parameters()["head.weight"]));
  // Resuming after iteration 3 ends bitwise where the uninterrupted run ended.
  // TorchScript -> lockstep -> TorchScript -> Python: the exported module holds the trained weights.
  for (const auto& [format, out] : {std::pair<std::string, std::string>{"torchscript", "trained.pt"}, {"pt", "state.pt"}}) {
    auto exported = testing::export_checkpoint(dir_.file("ddp/model_final.ckpt"), dir_.file(out), {"--format", format});
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
  }
  testing::write_file(dir_.file("compare.py"),
                      "import sys, torch\nm = torch.jit.load(sys.argv[1] + '/trained.pt')\n"
                      "sd = torch.load(sys.argv[1] + '/state.pt', weights_only=True)\n"
                      "assert sorted(m.state_dict()) == sorted(sd), (sorted(m.state_dict()), sorted(sd))\n"
                      "assert all(torch.equal(v, sd[k]) for k, v in m.state_dict().items())\n"
                      "print('exported module: trained weights')\n");
  auto compared = testing::run_command({testing::python(), dir_.file("compare.py"), dir_.path()}, {}, 120);
  EXPECT_THAT(compared.output, HasSubstr("exported module: trained weights"));

  // A work dir whose last checkpoint is the one after 3 iterations, as after a crash.
  std::filesystem::create_directories(dir_.file("ddp_resumed"));
  std::filesystem::copy_file(dir_.file("ddp/model_0000002.ckpt"), dir_.file("ddp_resumed/model_0000002.ckpt"));
  testing::write_file(dir_.file("ddp_resumed/last_checkpoint"), "model_0000002.ckpt\n");
  auto resumed = testing::run_command({testing::lockstep_binary(), "train", dir_.file("ddp.yaml"), "--nproc", "2",
                                       "--work-dir", dir_.file("ddp_resumed"), "--resume"},
                                      {}, 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  State resumed_state = read_checkpoint_file(dir_.file("ddp_resumed/model_final.ckpt"));
  for (const auto& [name, tensor] : final_state.tensors) {
    if (name.rfind("model/", 0) == 0) EXPECT_TRUE(torch::equal(resumed_state.tensors.at(name), tensor)) << name;
  }
}

// FSDP shards a scripted module as one unit: every sharding strategy trains
// the weights DDP trains (the bound the differential suite uses for C++
// models), and a wrap policy is refused with the reason. Separate DDP trains
// DDP's weights bitwise.
TEST_F(TorchScriptModelTest, FsdpAndSeparateDdpTrainWhatDdpTrains) {
  testing::write_file(dir_.file("run.yaml"), config("{type: SGD, lr: 0.05, momentum: 0.9}"));
  auto train = [&](const std::string& name, std::vector<std::string> sets) {
    std::vector<std::string> argv{testing::lockstep_binary(), "train", dir_.file("run.yaml"), "--nproc", "2",
                                  "--work-dir", dir_.file(name)};
    for (const auto& set : sets) argv.insert(argv.end(), {"--set", set});
    return testing::run_command(argv, {}, 300);
  };
  auto ddp = train("ddp", {});
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  const auto reference = read_checkpoint_file(dir_.file("ddp/model_final.ckpt")).tensors;
  for (const std::string sharding : {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"}) {
    auto fsdp = train("fsdp_" + sharding, {"strategy.type=FSDPStrategy",
                                           "strategy.model_wrapper={sharding_strategy: " + sharding + "}"});
    ASSERT_EQ(fsdp.exit_code, 0) << fsdp.output;
    const auto trained = read_checkpoint_file(dir_.file("fsdp_" + sharding + "/model_final.ckpt")).tensors;
    for (const auto& [name, tensor] : reference) {
      if (name.rfind("model/", 0) != 0) continue;
      ASSERT_TRUE(trained.count(name)) << sharding << " " << name;
      EXPECT_TRUE(torch::allclose(trained.at(name).to(torch::kDouble), tensor.to(torch::kDouble), 0, 1e-5))
          << sharding << " " << name;
    }
  }
  // Separate DDP (one DDP per top-level submodule): the same sums, bitwise.
  auto separate = train("separate", {"strategy.model_wrapper={type: MMSeparateDistributedDataParallel}"});
  ASSERT_EQ(separate.exit_code, 0) << separate.output;
  const auto separate_weights = read_checkpoint_file(dir_.file("separate/model_final.ckpt")).tensors;
  for (const auto& [name, tensor] : reference) {
    if (name.rfind("model/", 0) == 0) EXPECT_TRUE(torch::equal(separate_weights.at(name), tensor)) << name;
  }
  auto wrapped = train("wrapped", {"strategy.type=FSDPStrategy",
                                   "strategy.model_wrapper={auto_wrap_policy: {type: size_based, min_num_params: 10}}"});
  EXPECT_NE(wrapped.exit_code, 0);
  EXPECT_THAT(wrapped.output, HasSubstr("a TorchScriptModel is sharded as one FSDP unit"));
}

// torchvision's resnet18 (Debian's python3-torchvision): a state dict saved
// by torch.save, with other random weights than the scripted module's, loads
// strictly into the scripted resnet18, and the logits equal Python's.
TEST(TorchScriptResnet, TorchvisionWeightsLoadStrictlyAndGiveThePythonLogits) {
  if (!testing::python_has("torchvision")) GTEST_SKIP() << "no python3-torchvision";
  testing::TempDir dir;
  testing::write_file(dir.file("resnet.py"), R"PY(
import sys, torch, torchvision
out = sys.argv[1]
torch.manual_seed(0)
scripted = torch.jit.script(torchvision.models.resnet18(num_classes=10))
scripted.save(out + '/resnet18_scripted.pt')
torch.manual_seed(1)
eager = torchvision.models.resnet18(num_classes=10)
torch.save(eager.state_dict(), out + '/resnet18_weights.pt')
x = torch.randn(2, 3, 64, 64)
eager.eval()
scripted.load_state_dict(eager.state_dict())
scripted.eval()
with torch.no_grad():
    torch.save({'x': x, 'eager': eager(x), 'scripted': scripted(x)}, out + '/io.pt')
)PY");
  auto made = testing::run_command({testing::python(), dir.file("resnet.py"), dir.path()}, {}, 300);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto model = std::make_shared<TorchScriptModel>(TorchScriptModelOptions().path(dir.file("resnet18_scripted.pt")));
  SingleDeviceStrategy strategy(torch::kCPU);
  strategy.prepare(model, Config(), Config(), SchedulerContext{});
  const auto weights = read_pt_state_dict(dir.file("resnet18_weights.pt"));
  EXPECT_EQ(weights.size(), 122u);  // 62 parameters, 60 BatchNorm buffers
  LoadReport report = strategy.load_model_state_dict(weights, /*strict=*/true, dir.file("resnet18_weights.pt"));
  EXPECT_TRUE(report.missing.empty() && report.unexpected.empty() && report.mismatched.empty());
  model->eval();
  const auto io = read_pt_state_dict(dir.file("io.pt"));
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = model->forward(io.at("x"));
  // The same scripted graph on both sides: bitwise. Python's eager module: the same kernels, within rounding.
  EXPECT_TRUE(torch::equal(logits, io.at("scripted")));
  EXPECT_TRUE(torch::allclose(logits, io.at("eager"), 1e-5, 1e-5));
}

// examples/torchscript end to end, one epoch instead of three: export.py,
// lockstep train on 2 ranks, ckpt export --format torchscript, check.py.
// (Three epochs reach 0.92; see README.)
// One epoch over the first third of the training images (warmed up in 50
// steps, not the example's 300) learns enough to tell a trained model from an
// untrained one, in a third of a whole epoch's time. Evaluation in batches of
// 100 rather than the example's 500 (the same accuracy): a batch of 500
// images allocates each activation afresh from the kernel (above glibc's mmap
// threshold), page faults that made each evaluation take 2-3 times as long.
constexpr int kTrainImages = 20000;

TEST(TorchScriptExample, ExportTrainExportCheck) {
  if (!testing::python_has("torch")) GTEST_SKIP() << "no python3-torch";
  testing::TempDir dir;
  const std::string example = testing::source_dir() + "/examples/torchscript/";
  const std::string scripted = dir.file("cnn_scripted.pt");
  auto exported = testing::run_command({testing::python(), example + "export.py", scripted}, {}, 120);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  auto trained = testing::run_command({testing::lockstep_binary(), "train", example + "cnn_ddp.yaml", "--nproc", "2",
                                       "--work-dir", dir.file("run"), "--set", "model.path=" + scripted, "--set",
                                       "train_cfg.max_epochs=1", "--set", "param_scheduler.1.end=1", "--set",
                                       "param_scheduler.1.T_max=1", "--set", "param_scheduler.0.end=50", "--set",
                                       "train_dataloader.dataset.indices=" + std::to_string(kTrainImages), "--set",
                                       "val_dataloader.batch_size=100", "--set", "test_dataloader.batch_size=100"},
                                      {}, 600);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  auto module = testing::export_checkpoint(dir.file("run/model_final.ckpt"), dir.file("trained.pt"),
                                           {"--format", "torchscript"});
  ASSERT_EQ(module.exit_code, 0) << module.output;
  auto checked = testing::run_command({testing::python(), example + "check.py", dir.file("trained.pt")}, {}, 300);
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  const double python_accuracy = testing::number_after(checked.output, "torch.jit.load): ");
  EXPECT_GT(python_accuracy, 0.85) << checked.output;
  // What Python loaded is the model lockstep evaluated: the same test images,
  // the same accuracy up to a few images that rounding tips (0.8663 and 0.8665).
  EXPECT_NEAR(python_accuracy, testing::number_after(trained.output, "Final test accuracy/top1: "), 0.003)
      << checked.output;
}

}  // namespace
}  // namespace lockstep
