// Preemption: a job told to stop by a signal (a scheduler's SIGTERM, SLURM's
// --signal=USR1 warning) saves at an iteration every rank agrees on, exits
// with 75 ("start me again"), and the run started again with --resume ends
// bitwise equal to one that was never interrupted. A second signal, or a
// grace period that runs out while the save is stuck, ends the process at
// once without a torn checkpoint.
#include <gtest/gtest.h>

#include <filesystem>

#include "lockstep/core/stop_signals.h"
#include "tests/support/small_job.h"

namespace lockstep {
namespace {

using testing::contains;

const std::vector<std::string> kEnv{"LOCKSTEP_TIMEOUT_S=60"};

std::string fault_hook(const std::string& fields) { return "custom_hooks=[{type: FaultInjection, " + fields + "}]"; }

// The iteration of the one periodic checkpoint a preempted run saved beyond
// the schedule (every 5 iterations: 4, 9, ...), read from its log line.
int64_t preempted_at(const std::string& output) {
  const std::string marker = "Preempted after iteration ";
  const auto at = output.find(marker);
  if (at == std::string::npos) return -1;
  return std::stoll(output.substr(at + marker.size()));
}

class Preemption : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    config_ = testing::write_small_job(*dir_);
    auto straight = testing::run_command(
        testing::launched(2, {}, testing::train_argv(config_, dir_->file("straight"), {testing::ddp_strategy_line()})),
        kEnv, 180);
    ASSERT_EQ(straight.exit_code, 0) << straight.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::map<std::string, torch::Tensor> straight_weights() {
    return testing::checkpoint_weights(dir_->file("straight/model_final.ckpt"));
  }
  static testing::TempDir* dir_;
  static std::string config_;
};
testing::TempDir* Preemption::dir_ = nullptr;
std::string Preemption::config_;

// SIGTERM to `lockstep run` (what Kubernetes and a time limit do): forwarded
// to both workers, which stop at the same iteration, save, and exit 75.
TEST_F(Preemption, SigtermToTheLauncherSavesExits75AndTheResumedRunIsBitwiseEqual) {
  const std::string work = dir_->file("term");
  auto preempted = testing::run_command(
      testing::launched(2, {}, testing::train_argv(config_, work, {testing::ddp_strategy_line(),
                                                                    // a vote every iteration: stopped wherever the
                                                                    // forwarded signal lands, however late
                                                                    "preemption.check_interval=1",
                                                                    fault_hook("signal_at_iter: 12, signal: SIGTERM, "
                                                                               "signal_to: launcher, rank: 0")})),
      kEnv, 180);
  EXPECT_EQ(preempted.exit_code, kExitRequeue) << preempted.output;
  EXPECT_TRUE(contains(preempted.output, "lockstep run: received Terminated; forwarding it to the workers"))
      << preempted.output;
  EXPECT_TRUE(contains(preempted.output, "exiting with 75")) << preempted.output;
  const int64_t stopped = preempted_at(preempted.output);
  ASSERT_GE(stopped, 12) << preempted.output;
  ASSERT_LT(stopped, 29) << preempted.output;
  char name[32];
  std::snprintf(name, sizeof(name), "/model_%07lld.ckpt", static_cast<long long>(stopped));
  EXPECT_TRUE(testing::file_exists(work + name)) << preempted.output;
  EXPECT_FALSE(testing::file_exists(work + "/model_final.ckpt"));
  // Not the final weights yet.
  EXPECT_FALSE(testing::bitwise_equal(straight_weights(), testing::checkpoint_weights(work + name)));

  auto resumed = testing::run_command(
      testing::launched(2, {}, [&] {
        auto argv = testing::train_argv(config_, work, {testing::ddp_strategy_line()});
        argv.push_back("--resume");
        return argv;
      }()),
      kEnv, 180);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, std::string("Resuming from ") + work + name)) << resumed.output;
  EXPECT_TRUE(testing::bitwise_equal(straight_weights(), testing::checkpoint_weights(work + "/model_final.ckpt")));
}

// SLURM's warning signal reaching one rank only (or one rank an iteration
// before the other): it is a vote, and both ranks stop after the same one.
TEST_F(Preemption, ASignalOnOneRankStopsEveryRankAtTheSameIteration) {
  const std::string work = dir_->file("usr1");
  auto preempted = testing::run_command(
      testing::launched(2, {}, testing::train_argv(config_, work, {testing::ddp_strategy_line(),
                                                                    fault_hook("signal_at_iter: 7, signal: SIGUSR1, "
                                                                               "signal_to: self, rank: 1")})),
      kEnv, 180);
  EXPECT_EQ(preempted.exit_code, kExitRequeue) << preempted.output;
  // Rank 1's info lines go to its own log.
  const std::string rank1 = testing::read_file(work + "/log_rank1.txt");
  EXPECT_TRUE(contains(rank1, "sending SIGUSR1 to this process")) << rank1;
  EXPECT_TRUE(contains(rank1, "SIGUSR1 received: stopping at the iteration every rank agrees on")) << rank1;
  // The ranks vote every 10 iterations (preemption.check_interval): after iteration 9.
  EXPECT_TRUE(contains(rank1, "Stopping training after iteration 9: stop signal received; saving to resume later"))
      << rank1;
  EXPECT_TRUE(contains(preempted.output, "[rank0]: ")) << preempted.output;
  EXPECT_TRUE(contains(preempted.output, "Stopping training after iteration 9: another rank received a stop signal; "
                                         "saving to resume later"))
      << preempted.output;
  EXPECT_EQ(preempted_at(preempted.output), 9) << preempted.output;
  EXPECT_TRUE(testing::file_exists(work + "/model_0000009.ckpt")) << preempted.output;
  EXPECT_FALSE(testing::file_exists(work + "/model_0000014.ckpt")) << preempted.output;

  auto argv = testing::train_argv(config_, work, {testing::ddp_strategy_line()});
  argv.push_back("--resume");
  auto resumed = testing::run_command(testing::launched(2, {}, argv), kEnv, 180);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(testing::bitwise_equal(straight_weights(), testing::checkpoint_weights(work + "/model_final.ckpt")));
}

// The save after the signal is stuck (a disk that stopped answering): the
// grace period ends the process with 128 + SIGTERM, and what is on disk is
// the previous checkpoint, intact, which the next run resumes from.
TEST(PreemptionGrace, AStuckSaveEndsAtTheGracePeriodAndLeavesNoTornCheckpoint) {
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  const std::string work = dir.file("stuck");
  auto stuck = testing::run_command(
      testing::train_argv(config, work,
                          {"preemption.grace_s=2", fault_hook("signal_at_iter: 7, signal: SIGTERM, signal_to: self")}),
      {"LOCKSTEP_FAULT_STALL_AT=write:model_0000007.ckpt"}, 120);
  EXPECT_EQ(stuck.exit_code, 128 + SIGTERM) << stuck.output;
  EXPECT_TRUE(contains(stuck.output, "stalling until killed")) << stuck.output;
  EXPECT_TRUE(contains(stuck.output, "lockstep: the grace period of 2 s after SIGTERM ran out; exiting now"))
      << stuck.output;
  EXPECT_FALSE(testing::file_exists(work + "/model_0000007.ckpt"));
  EXPECT_EQ(testing::read_file(work + "/last_checkpoint"), "model_0000004.ckpt");

  auto resumed = testing::run_command(
      [&] {
        auto argv = testing::train_argv(config, work);
        argv.push_back("--resume");
        return argv;
      }(),
      {}, 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "Resuming from " + work + "/model_0000004.ckpt")) << resumed.output;
}

// A second signal while the save is stuck ends the process at once, with
// that signal, whatever the grace period.
TEST(PreemptionGrace, ASecondSignalEndsTheProcessAtOnce) {
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  const std::string work = dir.file("twice");
  const std::string log = dir.file("train.log");
  std::string command;
  for (const auto& arg : testing::train_argv(config, work, {"preemption.grace_s=0",
                                                            fault_hook("signal_at_iter: 7, signal: SIGUSR1, "
                                                                       "signal_to: self")})) {
    command += "'" + arg + "' ";
  }
  // The shell waits until the save is stuck, then sends SIGTERM.
  const std::string script = command + "> " + log + " 2>&1 & pid=$!; " +
                             "for i in $(seq 600); do grep -q 'stalling until killed' " + log +
                             " && break; sleep 0.1; done; kill -TERM $pid; wait $pid; echo \"exit=$?\"";
  auto twice = testing::run_command({"/bin/sh", "-c", script}, {"LOCKSTEP_FAULT_STALL_AT=write:model_0000007.ckpt"},
                                    120);
  const std::string output = testing::read_file(log);
  EXPECT_TRUE(contains(twice.output, "exit=143")) << twice.output << output;
  EXPECT_TRUE(contains(output, "stalling until killed")) << output;
  EXPECT_LT(twice.seconds, 60) << output;
  EXPECT_FALSE(testing::file_exists(work + "/model_0000007.ckpt"));
  EXPECT_EQ(testing::read_file(work + "/last_checkpoint"), "model_0000004.ckpt");
}

// One process, no launcher: the same stop, save and exit status.
TEST(PreemptionGrace, OneProcessStopsSavesAndExits75) {
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  const std::string work = dir.file("one");
  auto preempted = testing::run_command(
      testing::train_argv(config, work, {fault_hook("signal_at_iter: 3, signal: SIGTERM, signal_to: self")}), {}, 120);
  EXPECT_EQ(preempted.exit_code, kExitRequeue) << preempted.output;
  EXPECT_EQ(preempted_at(preempted.output), 3) << preempted.output;
  EXPECT_TRUE(testing::file_exists(work + "/model_0000003.ckpt"));
  // preemption.signals: [] turns it off: SIGTERM then ends the process as it always did.
  auto off = testing::run_command(
      testing::train_argv(config, dir.file("off"), {"preemption.signals=[]",
                                                    fault_hook("signal_at_iter: 3, signal: SIGTERM, signal_to: self")}),
      {}, 120);
  EXPECT_EQ(off.exit_code, 128 + SIGTERM) << off.output;
}

}  // namespace
}  // namespace lockstep
