// A job larger than its open-file limit (Note [Raising the open-file limit]
// in lockstep/core/open_files.cpp).
//
// Most Linux systems start a process with a soft limit of 1,024 open files,
// which a job of a thousand ranks outgrows: the launcher holds two pipes per
// worker and the job's store a connection or two per rank, each rank one
// socket per peer. The same arithmetic at 40 ranks under a soft limit of 40:
// before lockstep made room, the launcher failed at its 20th worker ("pipe:
// Too many open files") and, given enough for itself, each rank failed inside
// Gloo's mesh ("socket: Too many open files"). These tests run
// `lockstep train` the way a user does, under bash's `ulimit`:
// - a soft limit of 40 under a high hard one: the launcher raises its own,
//   gives each worker the 40 it started with, and every rank raises its own
//   (each logs it) and trains;
// - a hard limit of 40: the launcher says what it needs, before starting
//   anyone, and exits non-zero (no abort from a store thread);
// - one rank of 64 under a hard limit of 40, started by hand: it says so
//   naming its rank, at once, not after waiting for a store.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

int count_of(const std::string& text, const std::string& part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// `lockstep train` of the DDP test job under `ulimit_args` (e.g. "-Sn 40").
testing::CommandResult train_under_limit(const std::string& ulimit_args, const std::vector<std::string>& train_args,
                                         const std::vector<std::string>& env, double timeout_s) {
  std::vector<std::string> argv{"bash", "-c", "ulimit " + ulimit_args + " && exec \"$@\"", "bash",
                                testing::lockstep_binary(), "train",
                                testing::source_dir() + "/tests/e2e/distributed_run.yaml"};
  argv.insert(argv.end(), train_args.begin(), train_args.end());
  std::vector<std::string> full_env{"OMP_NUM_THREADS=1", "LOCKSTEP_TIMEOUT_S=120"};
  full_env.insert(full_env.end(), env.begin(), env.end());
  return testing::run_command(argv, full_env, timeout_s);
}

// The hard limit this test runs under must leave room to raise the soft one.
bool hard_limit_allows(rlim_t needed) {
  rlimit limit{};
  return getrlimit(RLIMIT_NOFILE, &limit) == 0 && (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed);
}

TEST(OpenFiles, FortyRanksTrainUnderASoftLimitOfForty) {
  if (!hard_limit_allows(1024)) GTEST_SKIP() << "the hard limit of open files here is below 1024";
  testing::TempDir dir;
  const auto run = train_under_limit("-Sn 40",
                                     {"--nproc", "40", "--work-dir", dir.file("work"), "--set", "train_cfg.max_iters=6"},
                                     {}, 540);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(testing::file_exists(dir.file("work/model_final.ckpt"))) << run.output;
  EXPECT_EQ(count_of(run.output, "lockstep run: raised the open-file limit (RLIMIT_NOFILE) from 40 to "), 1)
      << run.output;
  // Each rank started with the launcher's 40, not its raised limit, and made
  // its own room before it joined.
  for (int rank = 0; rank < 40; ++rank) {
    const std::string line = str_cat("rank ", rank, " of 40: raised the open-file limit (RLIMIT_NOFILE) from 40 to ");
    EXPECT_EQ(count_of(run.output, line), 1) << line << "\n" << run.output;
  }
  EXPECT_EQ(count_of(run.output, "Too many open files"), 0) << run.output;
}

TEST(OpenFiles, TooSmallAHardLimitStopsTheLauncherBeforeAnyWorker) {
  testing::TempDir dir;
  const auto run = train_under_limit("-n 40", {"--nproc", "40", "--work-dir", dir.file("work")}, {}, 120);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.exit_code, 128 + SIGABRT) << run.output;
  EXPECT_NE(run.output.find("lockstep run: starting 40 workers and hosting the store of a job of 40 ranks needs "
                            "about "),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("this process may open at most 40 (the hard limit of RLIMIT_NOFILE, `ulimit -Hn`)"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("[rank"), std::string::npos) << "a worker started:\n" << run.output;
  EXPECT_EQ(run.output.find("terminate called"), std::string::npos) << run.output;
}

TEST(OpenFiles, TooSmallAHardLimitStopsARankAtOnceNamingIt) {
  testing::TempDir dir;
  // Rank 5 of 64, started by hand as a scheduler would; nobody hosts the
  // store, so a rank that tried to reach it would wait out its timeout.
  const auto run = train_under_limit(
      "-n 40", {"--work-dir", dir.file("work")},
      {"RANK=5", "WORLD_SIZE=64", "LOCAL_RANK=5", "LOCAL_WORLD_SIZE=8", "MASTER_ADDR=127.0.0.1",
       str_cat("MASTER_PORT=", testing::free_port())},
      60);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.exit_code, 124) << "it waited:\n" << run.output;
  EXPECT_NE(run.output.find("rank 5: joining a job of 64 ranks needs about "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("this process may open at most 40"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace lockstep
