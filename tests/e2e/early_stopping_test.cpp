// EarlyStoppingHook through `lockstep train --nproc 2`: both ranks stop at the
// same iteration, write the final checkpoint and exit cleanly; resuming the
// stopped run trains nothing more.
#include <gtest/gtest.h>

#include "lockstep/checkpoint/checkpoint_layout.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

TEST(EarlyStoppingRun, BothRanksStopAtTheSameIterationAndWriteTheFinalCheckpoint) {
  testing::TempDir dir;
  // min_delta 1.0: no accuracy ever beats the first evaluation's by that
  // much, so evaluations after iterations 5 (best), 10 (wait 1) and 15
  // (wait 2 = patience) stop the run after iteration 15 of 300.
  const std::vector<std::string> args{
      testing::lockstep_binary(), "train", testing::source_dir() + "/examples/fashion_mnist/cnn_ddp.yaml", "--nproc", "2",
      "--work-dir", dir.file("run"),
      "--set", "train_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 256, seed: 1}",
      "--set", "val_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 64, seed: 2}",
      "--set", "test_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 64, seed: 2}",
      "--set", "train_cfg={_delete_: true, max_iters: 300, val_interval: 5}",
      "--set", "param_scheduler=[]",
      "--set", "default_hooks.checkpoint={interval: 100, by_epoch: false}",
      "--set", "custom_hooks=[{type: EarlyStoppingHook, monitor: accuracy/top1, min_delta: 1.0, patience: 2}]"};
  auto run = testing::run_command(args, {}, 300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* log : {"run/log.txt", "run/log_rank1.txt"}) {
    const std::string text = testing::read_file(dir.file(log));
    EXPECT_NE(text.find("Stopping training after iteration 14: the monitored metric accuracy/top1 did not improve "
                        "in the last 2 records"),
              std::string::npos)
        << log << ":\n" << text;
  }
  const CheckpointContents final_state = read_checkpoint(dir.file("run/model_final.ckpt"));
  ASSERT_TRUE(final_state.trainer.has_value());
  EXPECT_EQ(final_state.trainer->values.at("iteration").get<int64_t>(), 15);
  EXPECT_NE(run.output.find("Final test accuracy/top1: "), std::string::npos) << run.output;

  // Resumed, the run stays stopped.
  std::vector<std::string> resume = args;
  resume.push_back("--resume");
  auto resumed = testing::run_command(resume, {}, 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("Stopping training before iteration"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("iter: 20/"), std::string::npos) << resumed.output;
}

}  // namespace
}  // namespace lockstep
