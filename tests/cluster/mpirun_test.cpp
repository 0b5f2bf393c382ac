// Open MPI for real: `mpirun -np 4 lockstep train` on one host, with
// `launcher: mpi` and MASTER_ADDR, and with `launcher: auto` and nothing but
// what mpirun sets (a lockstep built with MPI finds rank 0 over
// MPI_COMM_WORLD), trains to the weights of the same job under
// `lockstep run`, bitwise. Across two hosts: tests/multinode (scenario mpirun).
#include <gtest/gtest.h>

#include "tests/support/small_job.h"
#include "tests/support/mpirun.h"

namespace lockstep {
namespace {

using testing::contains;

std::vector<std::string> train(const std::string& config, const std::string& work_dir, const std::string& launcher) {
  return {testing::lockstep_binary(), "train",
          config,
          "--work-dir",
          work_dir,
          "--set",
          "strategy={type: DDPStrategy, backend: gloo, launcher: " + launcher + "}"};
}

TEST(Mpirun, FourRanksOnOneHostTrainBitwiseLikeTheSameJobUnderLockstepRun) {
  if (auto problem = testing::mpirun_problem(/*needs_mpi_build=*/false); !problem.empty()) GTEST_SKIP() << problem;
  testing::TempDir dir;
  // The small job: shuffled, 30 iterations, 3 per epoch on 4 ranks.
  const std::string config = testing::write_small_job(dir);
  const std::vector<std::string> env{"LOCKSTEP_TIMEOUT_S=60", "OMP_NUM_THREADS=1"};

  auto loopback = testing::run_command(testing::launched(4, {}, train(config, dir.file("loopback"), "pytorch")), env, 300);
  ASSERT_EQ(loopback.exit_code, 0) << loopback.output;
  const auto expected = testing::checkpoint_weights(dir.file("loopback/model_final.ckpt"));
  // The comparison can fail: training moved the weights.
  EXPECT_FALSE(testing::bitwise_equal(expected, testing::checkpoint_weights(dir.file("loopback/model_0000019.ckpt"))));

  // launcher: mpi, rank 0's address given as Open MPI users give it.
  auto with_address = testing::run_command(
      testing::mpirun_command(4, train(config, dir.file("mpi"), "mpi"), false, {"MASTER_ADDR", "MASTER_PORT"}),
      {"LOCKSTEP_TIMEOUT_S=60", "OMP_NUM_THREADS=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29731"}, 300);
  ASSERT_EQ(with_address.exit_code, 0) << with_address.output;
  EXPECT_TRUE(contains(with_address.output, "strategy DDPStrategy (4 processes")) << with_address.output;
  EXPECT_TRUE(testing::bitwise_equal(expected, testing::checkpoint_weights(dir.file("mpi/model_final.ckpt"))));

  // launcher: auto and no MASTER_ADDR: found over MPI, or a clear error in a build without it.
  auto bare = testing::run_command(testing::mpirun_command(4, train(config, dir.file("auto"), "auto")), env, 300);
  if (!testing::built_with_mpi()) {
    EXPECT_NE(bare.exit_code, 0) << bare.output;
    EXPECT_TRUE(contains(bare.output, "launcher 'mpi': environment variable MASTER_ADDR is not set")) << bare.output;
    return;
  }
  ASSERT_EQ(bare.exit_code, 0) << bare.output;
  EXPECT_TRUE(contains(bare.output, "rank 0 of 4: found the others over MPI_COMM_WORLD (no MASTER_ADDR): rank 0 "
                                    "listens at 127.0.0.1:"))
      << bare.output;
  EXPECT_TRUE(testing::bitwise_equal(expected, testing::checkpoint_weights(dir.file("auto/model_final.ckpt"))));
}

}  // namespace
}  // namespace lockstep
