// PowerSGD's state survives a crash: a 2-rank DDP job with the PowerSGD comm
// hook loses a worker to SIGKILL after compression started; the launcher
// restarts it, it resumes from its checkpoint (error feedback of every rank,
// warm-start P and Q, the iteration and the random generator), and it ends
// bitwise equal to a run that was never interrupted.
#include <gtest/gtest.h>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "tests/support/small_job.h"

namespace lockstep {
namespace {

using testing::contains;

const char* const kPowerSGD =
    "strategy={type: DDPStrategy, launcher: pytorch, backend: gloo, model_wrapper: {comm_hook: {type: PowerSGD, "
    "matrix_approximation_rank: 2, start_powerSGD_iter: 3}}}";

TEST(CommHookResume, PowerSGDStateResumesBitwise) {
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  const std::vector<std::string> env{"LOCKSTEP_TIMEOUT_S=60"};
  auto straight = testing::run_command(
      testing::launched(2, {}, testing::train_argv(config, dir.file("straight"), {kPowerSGD})), env, 180);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  EXPECT_TRUE(contains(straight.output, "Start to apply PowerSGD after 3 iterations.")) << straight.output;

  // The checkpoint holds each rank's error feedback, and they differ.
  State saved = read_checkpoint_file(dir.file("straight/model_0000024.ckpt")).get("optim_wrapper");
  State hook = saved.get("gradient_sync").get("comm_hook");
  ASSERT_TRUE(hook.tensors.count("rank0/error.0") && hook.tensors.count("rank1/error.0")) << hook.values.dump();
  EXPECT_FALSE(torch::equal(hook.tensors.at("rank0/error.0"), hook.tensors.at("rank1/error.0")));
  EXPECT_TRUE(hook.tensors.count("rank0/q.0"));
  EXPECT_EQ(hook.values.at("iter").get<int64_t>(), 25);

  const std::string kill = "custom_hooks=[{type: FaultInjection, kill_at_iter: 17, rank: 1, attempt: 0}]";
  auto faulty = testing::run_command(
      testing::launched(2, {"--max-restarts", "1"}, testing::train_argv(config, dir.file("faulty"), {kPowerSGD, kill})),
      env, 180);
  ASSERT_EQ(faulty.exit_code, 0) << faulty.output;
  EXPECT_TRUE(contains(faulty.output, "restarting all workers (restart 1 of 1)")) << faulty.output;
  EXPECT_TRUE(contains(faulty.output, "Resuming from " + dir.file("faulty/model_0000014.ckpt"))) << faulty.output;
  EXPECT_TRUE(testing::bitwise_equal(testing::checkpoint_weights(dir.file("straight/model_final.ckpt")),
                                     testing::checkpoint_weights(dir.file("faulty/model_final.ckpt"))));
}

}  // namespace
}  // namespace lockstep
