// Whole runs on several processes: metrics gathered across ranks, a NaN on
// one rank stopping every rank, rank 0 alone writing shared outputs, and
// evaluation counting every sample exactly once.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/init.h"
#include "lockstep/runner/runner.h"
#include "lockstep/data/synthetic.h"
#include "lockstep/engine/hook.h"
#include "lockstep/hooks/hook_registry.h"
#include "lockstep/builtin_models/classifiers.h"
#include "lockstep/strategy/strategy.h"
#include "tests/support/multiprocess.h"
#include "tests/support/small_job.h"

namespace lockstep {
namespace {

// An MLP whose loss turns NaN on rank 1 from a given iteration on.
struct NanOnRankOne : MLP {
  explicit NanOnRankOne(int64_t from_call) : MLP(MLPOptions().in_features(64).hidden({16})), from_call_(from_call) {}
  LossDict loss(const Batch& data) override {
    LossDict losses = MLP::loss(data);
    if (get_rank() == 1 && calls_++ >= from_call_) losses["loss_cls"] = losses["loss_cls"] * NAN;
    return losses;
  }
  int64_t from_call_;
  int64_t calls_ = 0;
};
LOCKSTEP_REGISTER(model_registry(), "NanOnRankOne", [](const Config& config) {
  return std::make_shared<NanOnRankOne>(config.get<int64_t>("from_call"));
});

Config distributed_job() { return load_config(testing::source_dir() + "/tests/e2e/distributed_run.yaml"); }

std::string work_dir_from_env() {
  const char* dir = std::getenv("RUN_DIR");
  return dir != nullptr ? dir : "/tmp/lockstep_distributed_run";
}

LOCKSTEP_WORKER_TEST(DistributedRunWorker, TrainsAndEvaluatesLikeOneProcess) {
  Runner runner(distributed_job(), RunnerOptions().work_dir(work_dir_from_env()));
  ASSERT_EQ(runner.strategy().collectives()->world_size(), 2);
  auto metrics = runner.train();
  // Step metrics were gathered: every rank's storage holds the same loss (rank 0's, as mmengine logs it).
  auto loss = runner.trainer().storage().history("loss").latest();
  auto all = all_gather_object(nlohmann::json(loss));
  EXPECT_EQ(all[0], all[1]);
  EXPECT_TRUE(runner.trainer().storage().has("rank_data_time"));

  // Evaluation: 37 samples across 2 ranks (one padded repeat) count once each.
  // The reference evaluates the whole set in this process, with no communication.
  Model& model = *runner.strategy().model();
  model.eval();
  auto dataset = std::make_shared<SyntheticImages>(SyntheticImagesOptions().size(37).height(8).width(8).seed(2));
  Batch everything = dataset->get_batch([] {
    std::vector<int64_t> all_indices(37);
    for (int64_t i = 0; i < 37; ++i) all_indices[static_cast<size_t>(i)] = i;
    return all_indices;
  }(), 0);
  torch::Tensor logits = model.val_step(everything).at("logits");
  double top1 = logits.argmax(1).eq(everything.at("label")).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(metrics.at("accuracy/top1"), top1, 1e-12);
}

// The model's weights, flattened into one float64 tensor.
torch::Tensor flat_weights(Model& model) {
  std::vector<torch::Tensor> all;
  for (const auto& p : model.parameters()) all.push_back(p.detach().flatten().to(torch::kDouble));
  return torch::cat(all);
}

// What the model's weights were after the optim wrapper's step at `iteration`.
torch::Tensor weights_after_iteration;
struct KeepWeightsAfter : Hook {
  explicit KeepWeightsAfter(int64_t iteration) : Hook("KeepWeightsAfter"), iteration_(iteration) {}
  void after_step() override {
    if (trainer().iter() == iteration_) weights_after_iteration = flat_weights(trainer().model()).clone();
  }
  int64_t iteration_;
};
LOCKSTEP_REGISTER(hook_registry(), "KeepWeightsAfter", [](const Config& config, const HookContext&) {
  return std::make_shared<KeepWeightsAfter>(config.get<int64_t>("iteration"));
});

// Rank 1's loss turns NaN at iteration 3: every rank stops, naming it, with
// the weights it had after iteration 2 (Note [A non-finite loss stops before
// the step]); with `gather_metric_period` above 1 the loss is read later,
// and no rank steps in between.
void expect_stop_with_the_weights_before_the_nan(int64_t gather_metric_period) {
  Config config = distributed_job();
  config.apply_override("model={_delete_: true, type: NanOnRankOne, from_call: 3, data_preprocessor: "
                        "{type: ImgDataPreprocessor, mean: [100.0], std: [60.0]}}");
  config.apply_override("custom_hooks=[{type: KeepWeightsAfter, iteration: 2}]");
  config.apply_override("trainer={gather_metric_period: " + std::to_string(gather_metric_period) + "}");
  config.apply_override("default_hooks.checkpoint.interval=1");
  Runner runner(config, RunnerOptions().work_dir(work_dir_from_env()));
  const std::string message = testing::error_of([&] { runner.train(); });
  EXPECT_NE(message.find("Loss became infinite or NaN at iteration=3 on rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("the weights are those after iteration 2"), std::string::npos) << message;
  EXPECT_NE(message.find("loss_dict = {"), std::string::npos) << message;
  EXPECT_EQ(runner.trainer().iter(), gather_metric_period == 1 ? 3 : gather_metric_period - 1) << message;
  const torch::Tensor now = flat_weights(*runner.strategy().model());
  ASSERT_TRUE(weights_after_iteration.defined());
  EXPECT_TRUE(now.isfinite().all().item<bool>());
  EXPECT_TRUE(torch::equal(now, weights_after_iteration));
  // And the same on every rank.
  const auto all = all_gather_object(nlohmann::json(std::vector<double>(now.data_ptr<double>(),
                                                                        now.data_ptr<double>() + now.numel())));
  EXPECT_EQ(all[0], all[1]);
  // A checkpoint written after the NaN (one every iteration here: after
  // iteration 3 when the loss is read at 4) holds those weights too.
  std::map<std::string, torch::Tensor> parameters;
  for (const auto& item : runner.strategy().model()->named_parameters()) parameters[item.key()] = item.value();
  int written_after_the_nan = 0;
  for (int64_t iteration = 2; iteration <= runner.trainer().iter(); ++iteration) {
    const std::string path = fmt::format("{}/model_{:07d}.ckpt", work_dir_from_env(), iteration);
    if (!std::filesystem::exists(path)) continue;
    SCOPED_TRACE(path);
    written_after_the_nan += iteration >= 3 ? 1 : 0;
    const std::map<std::string, torch::Tensor> saved = testing::checkpoint_weights(path);
    for (const auto& [name, value] : parameters) {
      ASSERT_TRUE(saved.count(name)) << name;
      EXPECT_TRUE(torch::equal(saved.at(name), value.detach())) << name;
    }
  }
  if (gather_metric_period > 1) EXPECT_GE(written_after_the_nan, 1);
}

LOCKSTEP_WORKER_TEST(DistributedRunWorker, NanOnOneRankStopsEveryRank) { expect_stop_with_the_weights_before_the_nan(1); }

LOCKSTEP_WORKER_TEST(DistributedRunWorker, NanReadLaterStillStopsBeforeTheStep) {
  expect_stop_with_the_weights_before_the_nan(5);
}

// The asynchronous metrics writer gathers on its own thread while the main
// thread gathers evaluation records after every iteration: if the two shared
// a process group, ranks could issue their collectives in different orders
// (a hang, or one call's payload delivered to the other).
LOCKSTEP_WORKER_TEST(DistributedRunWorker, AsyncMetricsBesideEvaluationEveryIteration) {
  Config config = distributed_job();
  config.apply_override("trainer={async_write_metrics: true}");
  config.apply_override("train_cfg={max_iters: 48, val_interval: 1}");
  config.apply_override("val_dataloader.batch_size=2");
  config.apply_override("default_hooks.logger.interval=1");
  Runner runner(config, RunnerOptions().work_dir(work_dir_from_env()));
  auto metrics = runner.train();
  EXPECT_EQ(runner.trainer().storage().history("loss").size(), 48u);
  EXPECT_EQ(runner.trainer().storage().history("accuracy/top1").size(), 48u);
  auto all = all_gather_object(nlohmann::json(metrics.at("accuracy/top1")));
  EXPECT_EQ(all[0], all[1]);
}

// `worker` on two ranks, each training into a work dir of its own run; a
// collective waits at most `collective_timeout_s`, the whole run `timeout_s`.
testing::CommandResult run_two_ranks(const std::string& worker, int collective_timeout_s, double timeout_s) {
  testing::TempDir dir;
  testing::WorkersOptions options;
  options.env = {"RUN_DIR=" + dir.path(), "LOCKSTEP_TIMEOUT_S=" + std::to_string(collective_timeout_s)};
  options.timeout_s = timeout_s;
  return testing::run_workers(2, worker, options);
}

TEST(DistributedRun, TwoRanksTrainEvaluateAndOnlyRankZeroWritesSharedFiles) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  auto result = testing::run_workers(2, "DistributedRunWorker.TrainsAndEvaluatesLikeOneProcess",
                                     {"RUN_DIR=" + dir.path()});
  EXPECT_WORKERS_OK(result);
  EXPECT_TRUE(testing::file_exists(dir.file("metrics.jsonl")));
  EXPECT_TRUE(testing::file_exists(dir.file("log.txt")));
  EXPECT_TRUE(testing::file_exists(dir.file("log_rank1.txt")));
  EXPECT_TRUE(testing::file_exists(dir.file("model_final.ckpt")));
  // Progress lines come from rank 0 only.
  std::istringstream lines(result.output);
  std::string line;
  int rank0_progress = 0;
  while (std::getline(lines, line)) {
    if (line.find("iter: ") == std::string::npos) continue;
    EXPECT_EQ(line.rfind("[rank1]", 0), std::string::npos) << line;
    rank0_progress += line.rfind("[rank0]", 0) == 0;
  }
  EXPECT_GT(rank0_progress, 0) << result.output;
}

TEST(DistributedRun, NanOnOneRankStopsEveryRankWithoutAHang) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  const auto result = run_two_ranks("DistributedRunWorker.NanOnOneRankStopsEveryRank", /*collective_timeout_s=*/30,
                                    /*timeout_s=*/120);
  EXPECT_WORKERS_OK(result);
}

TEST(DistributedRun, NanReadFiveIterationsLaterLeavesTheWeightsOfTheLastGoodStep) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  const auto result = run_two_ranks("DistributedRunWorker.NanReadLaterStillStopsBeforeTheStep",
                                    /*collective_timeout_s=*/30, /*timeout_s=*/120);
  EXPECT_WORKERS_OK(result);
}

TEST(DistributedRun, AsyncMetricsAndEvaluationEveryIterationNeverCross) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  const auto result = run_two_ranks("DistributedRunWorker.AsyncMetricsBesideEvaluationEveryIteration",
                                    /*collective_timeout_s=*/60, /*timeout_s=*/240);
  EXPECT_WORKERS_OK(result);
}

}  // namespace
}  // namespace lockstep
