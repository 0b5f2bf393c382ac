// Automatic recovery: a 2-rank DDP job under `lockstep run --max-restarts 2`
// loses a worker to SIGKILL at a random iteration; the launcher restarts the
// job, which resumes from its last good checkpoint by itself, and ends with
// weights bitwise equal to those of a run that was never interrupted.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <random>

#include "tests/support/small_job.h"

namespace lockstep {
namespace {

using testing::contains;

// The fault is drawn from a seeded generator, so a failure can be replayed:
// LOCKSTEP_TEST_SEED=<seed printed by a failing run>.
uint64_t test_seed() {
  const char* text = std::getenv("LOCKSTEP_TEST_SEED");
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : 20261121;
}

TEST(Restart, KilledWorkerIsRestartedAndTheJobEndsBitwiseEqualToAnUninterruptedRun) {
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  const std::vector<std::string> env{"LOCKSTEP_TIMEOUT_S=60"};

  auto straight = testing::run_command(
      testing::launched(2, {}, testing::train_argv(config, dir.file("straight"), {testing::ddp_strategy_line()})), env,
      180);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  std::mt19937_64 generator(test_seed());
  const int rank = static_cast<int>(generator() % 2);
  const int iteration = 3 + static_cast<int>(generator() % 26);  // in [3, 28]: some checkpoint may exist, some not
  std::cout << "seed " << test_seed() << ": SIGKILL rank " << rank << " at iteration " << iteration << std::endl;
  const std::string hook = "custom_hooks=[{type: FaultInjection, kill_at_iter: " + std::to_string(iteration) +
                           ", rank: " + std::to_string(rank) + ", attempt: 0}]";
  auto faulty = testing::run_command(
      testing::launched(2, {"--max-restarts", "2"},
                        testing::train_argv(config, dir.file("faulty"), {testing::ddp_strategy_line(), hook})),
      env, 180);
  ASSERT_EQ(faulty.exit_code, 0) << faulty.output;

  // The kill happened where it was meant to, and the launcher restarted the job once.
  EXPECT_TRUE(contains(faulty.output, "[rank" + std::to_string(rank) + "]: lockstep fault injection: rank " +
                                          std::to_string(rank) + " killed at iteration " + std::to_string(iteration)))
      << faulty.output;
  EXPECT_TRUE(contains(faulty.output, "(pid ")) << faulty.output;
  EXPECT_TRUE(contains(faulty.output, "was killed by signal 9")) << faulty.output;
  EXPECT_TRUE(contains(faulty.output, "restarting all workers (restart 1 of 2)")) << faulty.output;
  EXPECT_FALSE(contains(faulty.output, "restart 2 of 2")) << faulty.output;
  // The restarted job resumed by itself from the newest checkpoint written
  // before the kill (iterations 4, 9, 14, ... save), or started afresh if none was.
  const int last_saved = (iteration / 5) * 5 - 1;
  if (last_saved >= 0) {
    char name[32];
    std::snprintf(name, sizeof(name), "model_%07d.ckpt", last_saved);
    EXPECT_TRUE(contains(faulty.output, "Restart 1 of this job: resuming")) << faulty.output;
    EXPECT_TRUE(contains(faulty.output, std::string("Resuming from ") + dir.file("faulty/") + name)) << faulty.output;
  } else {
    EXPECT_TRUE(contains(faulty.output, "no checkpoint in")) << faulty.output;
  }

  auto expected = testing::checkpoint_weights(dir.file("straight/model_final.ckpt"));
  auto actual = testing::checkpoint_weights(dir.file("faulty/model_final.ckpt"));
  EXPECT_TRUE(testing::bitwise_equal(expected, actual));
  // The comparison can fail: training moved the weights away from the start.
  auto first = testing::checkpoint_weights(dir.file("straight/model_0000019.ckpt"));
  EXPECT_FALSE(testing::bitwise_equal(expected, first));
}

}  // namespace
}  // namespace lockstep
