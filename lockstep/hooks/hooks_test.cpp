// The built-in hooks, each driven by a real Trainer on a tiny model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/engine/checkpointer.h"
#include "lockstep/data/data_loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/data/synthetic.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/best_checkpointer.h"
#include "lockstep/hooks/eval_hook.h"
#include "lockstep/hooks/iteration_timer.h"
#include "lockstep/hooks/lr_scheduler_hook.h"
#include "lockstep/hooks/periodic_checkpointer.h"
#include "lockstep/hooks/periodic_writer.h"
#include "lockstep/builtin_models/classifiers.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

struct Rig {
  Rig() {
    torch::manual_seed(0);
    model = std::make_shared<MLP>(MLPOptions().in_features(64).hidden({8}));
    model->set_data_preprocessor(std::make_shared<ImgDataPreprocessor>(std::vector<double>{}, std::vector<double>{}));
    auto data = std::make_shared<SyntheticImages>(SyntheticImagesOptions().size(64).height(8).width(8));
    loader = std::make_shared<DataLoader>(data, std::make_shared<SequentialSampler>(64), DataLoaderOptions().batch_size(8));
    strategy = std::make_shared<SingleDeviceStrategy>();
    strategy->prepare(model, parse_config("optimizer: {type: SGD, lr: 0.1}"),
                      parse_config("- {type: StepLR, step_size: 3, gamma: 0.5, by_epoch: false}"),
                      SchedulerContext{8, 10});
    trainer = std::make_unique<Trainer>(strategy->model(), loader, strategy->optim_wrapper());
  }
  std::shared_ptr<MLP> model;
  std::shared_ptr<DataLoader> loader;
  std::shared_ptr<SingleDeviceStrategy> strategy;
  std::unique_ptr<Trainer> trainer;
};

TEST(LRSchedulerHookTest, LogsTheLrUsedByEachStepThenSteps) {
  Rig rig;
  rig.trainer->register_hooks({std::make_shared<LRSchedulerHook>(rig.strategy->optim_wrapper(), rig.strategy->schedulers())});
  rig.trainer->train(0, 7);
  auto lr = rig.trainer->storage().history("lr");
  ASSERT_EQ(lr.size(), 7u);
  const double expected[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025};
  for (size_t i = 0; i < 7; ++i) EXPECT_DOUBLE_EQ(lr.values()[i].first, expected[i]) << i;
}

TEST(IterationTimerTest, RecordsStepTimesAfterWarmup) {
  Rig rig;
  rig.trainer->register_hooks({std::make_shared<IterationTimer>(/*warmup_iters=*/2)});
  rig.trainer->train(0, 6);
  auto time = rig.trainer->storage().history("time");
  EXPECT_EQ(time.size(), 4u);
  EXPECT_EQ(time.values().front().second, 2);
  EXPECT_GT(time.latest(), 0.0);
}

TEST(PeriodicCheckpointerTest, KeepsTheNewestFilesAndTheFinalOne) {
  testing::TempDir dir;
  Rig rig;
  auto checkpointer = std::make_shared<Checkpointer>(rig.strategy, dir.path());
  rig.trainer->register_hooks({std::make_shared<PeriodicCheckpointer>(checkpointer, 2, /*max_to_keep=*/2)});
  rig.trainer->train(0, 9);
  EXPECT_FALSE(testing::file_exists(dir.file("model_0000001.ckpt")));
  EXPECT_FALSE(testing::file_exists(dir.file("model_0000003.ckpt")));
  EXPECT_TRUE(testing::file_exists(dir.file("model_0000005.ckpt")));
  EXPECT_TRUE(testing::file_exists(dir.file("model_0000007.ckpt")));
  EXPECT_TRUE(testing::file_exists(dir.file("model_final.ckpt")));
  EXPECT_EQ(*checkpointer->last_checkpoint(), dir.file("model_final.ckpt"));
  // The final file carries the trainer's state as of the last iteration's
  // after_step (iteration 8; a resume starts at 9), with the hook's kept list.
  std::optional<CheckpointContents> resumed = checkpointer->resume();
  ASSERT_TRUE(resumed.has_value());
  ASSERT_TRUE(resumed->trainer.has_value());
  nlohmann::json expected = rig.trainer->state().values;
  expected["iteration"] = 8;
  EXPECT_EQ(resumed->trainer->values, expected);
}

TEST(EvalHookTest, EvaluatesPeriodicallyAndFinallyOnlyAfterACompletedRun) {
  Rig rig;
  std::vector<int64_t> evaluated_at;
  auto eval = std::make_shared<EvalHook>(3, [&] {
    EXPECT_FALSE(rig.model->is_training()) << "evaluation must run in eval mode";
    evaluated_at.push_back(rig.trainer->iter());
    return std::map<std::string, double>{{"val/acc", 0.5}};
  });
  rig.trainer->register_hooks({eval});
  rig.trainer->train(0, 7);
  EXPECT_EQ(evaluated_at, (std::vector<int64_t>{2, 5, 7}));  // iterations 3 and 6 done, then the final one
  EXPECT_TRUE(rig.model->is_training());

  Rig failing;
  std::vector<int64_t> failed_evals;
  struct Crash : Hook {
    Crash() : Hook("Crash") {}
    void before_step() override {
      if (trainer().iter() == 4) throw std::runtime_error("crash");
    }
  };
  failing.trainer->register_hooks({std::make_shared<EvalHook>(3, [&] {
                                     failed_evals.push_back(failing.trainer->iter());
                                     return std::map<std::string, double>{};
                                   }),
                                   std::make_shared<Crash>()});
  EXPECT_THROW(failing.trainer->train(0, 7), std::runtime_error);
  EXPECT_EQ(failed_evals, (std::vector<int64_t>{2})) << "no final evaluation after a failed run";
}

TEST(BestCheckpointerTest, SavesOnImprovementAndSkipsNaN) {
  testing::TempDir dir;
  Rig rig;
  auto checkpointer = std::make_shared<Checkpointer>(rig.strategy, dir.path());
  std::vector<double> scores{0.5, std::nan(""), 0.4, 0.7};
  size_t next = 0;
  auto eval = std::make_shared<EvalHook>(2, [&] {
    return std::map<std::string, double>{{"acc", scores[next++]}};
  });
  auto best = std::make_shared<BestCheckpointer>(2, checkpointer, "acc", "max");
  rig.trainer->register_hooks({eval, best});
  rig.trainer->train(0, 8);  // evaluations after iterations 2, 4, 6 and the final one
  EXPECT_EQ(next, 4u);
  ASSERT_TRUE(best->best_value().has_value());
  EXPECT_DOUBLE_EQ(*best->best_value(), 0.7);
  EXPECT_TRUE(testing::file_exists(dir.file("model_best.ckpt")));
  // The best value survives in the hook's state.
  BestCheckpointer restored(2, checkpointer, "acc", "max");
  restored.load_state(best->state());
  EXPECT_DOUBLE_EQ(*restored.best_value(), 0.7);
}

}  // namespace
}  // namespace lockstep
