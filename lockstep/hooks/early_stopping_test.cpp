// EarlyStoppingHook against hand-computed stops for scripted metric
// sequences, inside a real Trainer with EvalHook; its state resumes; a
// resumed run that had stopped stays stopped.
#include "lockstep/hooks/early_stopping.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/eval_hook.h"
#include "lockstep/hooks/hooks_test_util.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

// Trains up to 100 iterations, evaluating every 2, with `scores` as the
// metric of successive evaluations; returns the iterations run.
struct ScriptedRun {
  ScriptedRun(EarlyStoppingHook::Options options, std::vector<double> scores) : scores_(std::move(scores)) {
    // (rig_ is built first: members initialise in declaration order.)
    trainer_ = std::move(rig_.trainer);
    hook_ = std::make_shared<EarlyStoppingHook>(options);
    auto eval = std::make_shared<EvalHook>(2, [this] {
      std::map<std::string, double> metrics{{"acc", scores_.at(std::min(evaluations_, scores_.size() - 1))}};
      ++evaluations_;
      trainer_->hooks().after_eval_epoch(false, metrics);
      return metrics;
    });
    eval->set_priority(kLow);
    trainer_->register_hooks({hook_, eval});
  }
  int64_t run(int64_t max_iter = 100) {
    trainer_->train(trainer_->iter() > 0 ? trainer_->iter() + 1 : 0, max_iter);
    return trainer_->iter();
  }
  std::vector<double> scores_;
  size_t evaluations_ = 0;
  testing::TrainerRig rig_{testing::tiny_mlp(4, 4), /*examples=*/16, /*side=*/4};
  std::unique_ptr<Trainer> trainer_;
  std::shared_ptr<EarlyStoppingHook> hook_;
};

EarlyStoppingHook::Options accuracy(double min_delta, int64_t patience) {
  EarlyStoppingHook::Options options;
  options.monitor = "acc";
  options.rule = "greater";
  options.min_delta = min_delta;
  options.patience = patience;
  return options;
}

TEST(EarlyStopping, StopsAfterPatienceEvaluationsWithoutImprovement) {
  // Evaluations after iterations 2, 4, 6, ...: 0.5 best; 0.52 (not > 0.5 + 0.05) waits 1; 0.60 best;
  // 0.62 waits 1; 0.64 waits 2; 0.58 waits 3 = patience: stop after the 6th evaluation, iteration 12.
  ScriptedRun run(accuracy(0.05, 3), {0.5, 0.52, 0.60, 0.62, 0.64, 0.58, 0.9});
  EXPECT_EQ(run.run(), 12);
  EXPECT_TRUE(run.trainer_->stop().stopped_early());
  EXPECT_EQ(run.evaluations_, 6u);  // the final evaluation is the one that stopped it
  EXPECT_DOUBLE_EQ(run.hook_->best_score(), 0.60);
  EXPECT_EQ(run.hook_->wait_count(), 3);
}

TEST(EarlyStopping, ThresholdAndNonFiniteValuesStopAtOnce) {
  auto threshold = accuracy(0.0, 10);
  threshold.stopping_threshold = 0.8;
  ScriptedRun reached(threshold, {0.5, 0.7, 0.81, 0.9});
  EXPECT_EQ(reached.run(), 6);
  ScriptedRun nan(accuracy(0.0, 10), {0.5, std::nan(""), 0.9});
  EXPECT_EQ(nan.run(), 4);
  // "less" with min_delta: 1.0 best, 0.95 (not < 1.0 - 0.1) waits, 0.85 best, 0.8 waits, 0.79 waits: stop at 10.
  EarlyStoppingHook::Options loss;
  loss.monitor = "acc";
  loss.rule = "less";
  loss.min_delta = 0.1;
  loss.patience = 2;
  ScriptedRun falling(loss, {1.0, 0.95, 0.85, 0.8, 0.79, 0.1});
  EXPECT_EQ(falling.run(), 10);
}

TEST(EarlyStopping, StateResumesAndAStoppedRunStaysStopped) {
  ScriptedRun first(accuracy(0.05, 3), {0.5, 0.52, 0.60, 0.62, 0.64, 0.58});
  first.run(8);  // 4 evaluations: best 0.60, waiting 1
  const State saved = first.hook_->state();
  EXPECT_EQ(first.hook_->wait_count(), 1);
  ScriptedRun second(accuracy(0.05, 3), {0.64, 0.58});
  second.hook_->load_state(saved);
  second.trainer_->train(8, 100);
  EXPECT_EQ(second.trainer_->iter(), 12);  // the same stop as the uninterrupted run
  ScriptedRun third(accuracy(0.05, 3), {0.9});
  third.hook_->load_state(second.hook_->state());
  third.trainer_->train(12, 100);
  EXPECT_EQ(third.trainer_->iter(), 12);  // nothing more is trained
  EXPECT_EQ(third.evaluations_, 1u);      // only the final evaluation, as for any finished run resumed
}

TEST(EarlyStopping, RuleFromTheMetricName) {
  EXPECT_EQ(EarlyStoppingHook::default_rule("accuracy/top1"), "greater");
  EXPECT_EQ(EarlyStoppingHook::default_rule("val/loss"), "less");
  EXPECT_EQ(EarlyStoppingHook::default_rule("psnr"), "");
}

}  // namespace
}  // namespace lockstep
