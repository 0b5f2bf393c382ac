// Checkpoints under faults: a writer SIGKILLed in the middle of a save, and a
// save that runs out of space. Either way the previous checkpoint stays
// intact and is what the next start resumes from.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/support/small_job.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::contains;

std::vector<std::string> partial_files(const std::string& work_dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(work_dir)) {
    if (contains(entry.path().filename().string(), ".tmp-")) found.push_back(entry.path().filename().string());
  }
  return found;
}

// The output of the small job trained in `work_dir` and SIGKILLed where it
// reaches the fault point `point` (LOCKSTEP_FAULT_KILL_AT's form: "write:<file>[@chunk]").
std::string train_killed_at(const std::string& config, const std::string& work_dir, const std::string& point) {
  auto killed = testing::run_command(testing::train_argv(config, work_dir), {"LOCKSTEP_FAULT_KILL_AT=" + point}, 120);
  EXPECT_EQ(killed.exit_code, 128 + 9) << killed.output;
  return killed.output;
}

// The job in `work_dir` started again as the launcher restarts it, so that it
// resumes from the last checkpoint there.
testing::CommandResult restarted(const std::string& config, const std::string& work_dir) {
  return testing::run_command(testing::train_argv(config, work_dir), {"TORCHELASTIC_RESTART_COUNT=1"}, 120);
}

TEST(CheckpointFault, WriterKilledMidSaveResumesFromThePreviousCheckpoint) {
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  const std::string work_dir = dir.file("run");

  // Chunk 1 is the header length, chunk 2 the header: the process dies with
  // the header on disk and not one tensor byte.
  const std::string killed = train_killed_at(config, work_dir, "write:model_0000019.ckpt@2");
  EXPECT_TRUE(contains(killed, "reached fault point 'write:model_0000019.ckpt'")) << killed;
  EXPECT_FALSE(testing::file_exists(work_dir + "/model_0000019.ckpt"));
  EXPECT_EQ(testing::read_file(work_dir + "/last_checkpoint"), "model_0000014.ckpt");
  auto partial = partial_files(work_dir);
  ASSERT_EQ(partial.size(), 1u) << "the kill should leave the half-written temporary behind";
  EXPECT_EQ(partial[0].rfind(".model_0000019.ckpt.tmp-", 0), 0u) << partial[0];
  EXPECT_GT(fs::file_size(work_dir + "/" + partial[0]), 8u);

  auto resumed = restarted(config, work_dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "Resuming from " + work_dir + "/model_0000014.ckpt")) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "a partial checkpoint left by a save that was interrupted")) << resumed.output;
  EXPECT_TRUE(partial_files(work_dir).empty());

  auto straight = testing::run_command(testing::train_argv(config, dir.file("straight")), {}, 120);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  EXPECT_TRUE(testing::bitwise_equal(testing::checkpoint_weights(dir.file("straight/model_final.ckpt")),
                                     testing::checkpoint_weights(work_dir + "/model_final.ckpt")));
}

TEST(CheckpointFault, FullDiskWhileSavingKeepsThePreviousCheckpointAndStopsWithAClearError) {
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  const std::string work_dir = dir.file("run");
  train_killed_at(config, work_dir, "write:model_0000014.ckpt");
  ASSERT_FALSE(HasFailure()) << "the first run must die at the fault point";
  const std::string previous = work_dir + "/model_0000009.ckpt";
  const std::string previous_bytes = testing::read_file(previous);
  const auto checkpoint_size = previous_bytes.size();

  // The resumed run may write no file past half a checkpoint: its next save
  // fails with EFBIG, as a full disk fails with ENOSPC (SIGXFSZ ignored so
  // the write returns the error instead of killing the process).
  const std::string limit = std::to_string(checkpoint_size / 2);
  std::vector<std::string> argv{"/bin/sh", "-c", "trap '' XFSZ; exec prlimit --fsize=" + limit + " \"$@\"", "sh"};
  auto command = testing::train_argv(config, work_dir, {});
  argv.insert(argv.end(), command.begin(), command.end());
  argv.push_back("--resume");
  auto full = testing::run_command(argv, {}, 120);
  EXPECT_EQ(full.exit_code, 1) << full.output;
  EXPECT_TRUE(contains(full.output, "Resuming from " + previous)) << full.output;
  EXPECT_TRUE(contains(full.output, "lockstep: error: cannot write " + work_dir +
                                        "/model_0000014.ckpt: writing failed: File too large (the disk is full, or a quota or file "
                                        "size limit is reached"))
      << full.output;
  EXPECT_TRUE(contains(full.output, "the previous version of the file is untouched")) << full.output;
  EXPECT_FALSE(contains(full.output, "core dumped")) << full.output;

  // Nothing half-written, the pointer still names the previous checkpoint,
  // and that checkpoint is byte for byte what it was.
  EXPECT_TRUE(partial_files(work_dir).empty());
  EXPECT_FALSE(testing::file_exists(work_dir + "/model_0000014.ckpt"));
  EXPECT_EQ(testing::read_file(work_dir + "/last_checkpoint"), "model_0000009.ckpt");
  EXPECT_EQ(testing::read_file(previous), previous_bytes);
  EXPECT_EQ(verify_checkpoint_file(previous), "");

  // With space again, the next start resumes from it and finishes.
  auto freed = restarted(config, work_dir);
  EXPECT_EQ(freed.exit_code, 0) << freed.output;
  EXPECT_TRUE(contains(freed.output, "Resuming from " + previous)) << freed.output;
}

}  // namespace
}  // namespace lockstep
