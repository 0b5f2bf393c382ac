// lockstep's C API, driven by C programs (tests/capi/*.c) as a simulation
// code would drive it, under the launcher:
//   - a run stopped after a checkpoint and resumed through the C API ends
//     bitwise equal to the run that was not stopped (scheduler, momentum and
//     the iteration count included);
//   - every kind of bad input is a status and a message naming it, and the
//     program goes on; a rank that calls predict while another trains fails
//     every rank at once, and both go on.
// (That the C API trains to PyTorch's own DDP weights, bitwise, is the
// differential suite's case CApi_DDP_2ranks.)
#include <gtest/gtest.h>

#include "tests/support/small_job.h"
#include "tests/support/capi_support.h"
#include "tests/support/multiprocess.h"

namespace lockstep {
namespace {

using testing::contains;

std::string capi_job() { return testing::read_file(testing::source_dir() + "/tests/capi/capi_job.yaml"); }

std::string capi_program(const std::string& name) { return testing::binary_dir() + "/tests/" + name; }

testing::CommandResult run_capi_train(const testing::TempDir& dir, const std::string& work,
                                      const std::vector<std::string>& extra = {},
                                      const std::vector<std::string>& env = {}) {
  std::vector<std::string> command{capi_program("capi_train"), dir.file("run.yaml"), dir.file("data.bin"),
                                   dir.file(work), "20", "8"};
  command.insert(command.end(), extra.begin(), extra.end());
  return testing::run_command(testing::launched(2, {}, command), env, 240);
}

TEST(CApi, AStoppedRunResumedThroughTheCApiEndsBitwiseEqual) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  testing::write_file(dir.file("run.yaml"), capi_job());
  testing::write_capi_training_data(dir.file("data.bin"), 20 * 8 * 2);

  auto straight = run_capi_train(dir, "straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  auto stopped = run_capi_train(dir, "stopped", {"9"});
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  ASSERT_TRUE(testing::file_exists(dir.file("stopped/interrupted.ckpt"))) << stopped.output;
  EXPECT_FALSE(testing::file_exists(dir.file("stopped/model_final.ckpt")));
  auto resumed = run_capi_train(dir, "stopped", {"-1", dir.file("stopped/interrupted.ckpt")});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "capi_train: resumed after iteration 9")) << resumed.output;
  EXPECT_TRUE(testing::bitwise_equal(testing::checkpoint_weights(dir.file("straight/model_final.ckpt")),
                                     testing::checkpoint_weights(dir.file("stopped/model_final.ckpt"))));
}

// capi_job.yaml in one process.
std::string single_process_job() {
  const std::string ddp = "strategy: {type: DDPStrategy, launcher: pytorch, backend: gloo}";
  std::string single = capi_job();
  single.replace(single.find(ddp), ddp.size(), "strategy: {type: SingleDeviceStrategy, device: cpu}");
  return single;
}

// A simulation's double-precision fields (C's double, Fortran's real(8)) are
// converted to the model's float32 in one copy (Note [The C API meets arrays
// as they are]); values float32 holds exactly train bitwise as float32 arrays.
// The final weights of a one-process run of `program argv...` in `work`.
std::map<std::string, torch::Tensor> final_weights(const testing::TempDir& dir, std::vector<std::string> argv,
                                                   const std::string& work) {
  auto run = testing::run_command(argv, {}, 240);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return testing::checkpoint_weights(dir.file(work + "/model_final.ckpt"));
}

TEST(CApi, Float64ArraysFromCTrainBitwiseAsFloat32) {
  testing::TempDir dir;
  testing::write_file(dir.file("run.yaml"), single_process_job());
  testing::write_capi_training_data(dir.file("data.bin"), 20 * 8);
  const std::string program = capi_program("capi_train");
  const auto f32 = final_weights(dir, {program, dir.file("run.yaml"), dir.file("data.bin"), dir.file("f32"), "20", "8"},
                                 "f32");
  const auto f64 = final_weights(
      dir, {program, "--float64", dir.file("run.yaml"), dir.file("data.bin"), dir.file("f64"), "20", "8"}, "f64");
  EXPECT_TRUE(testing::bitwise_equal(f32, f64));
  // Only the conversion differs: other data trains otherwise (the check can fail).
  const auto fewer = final_weights(dir, {program, dir.file("run.yaml"), dir.file("data.bin"), dir.file("fewer"), "19", "8"},
                                   "fewer");
  EXPECT_FALSE(testing::bitwise_equal(f32, fewer));
}

TEST(CApi, Real8ArraysFromFortranTrainBitwiseAsReal4) {
  const std::string marker = testing::binary_dir() + "/tests/lockstep_with_fortran";
  if (!testing::file_exists(marker) || testing::read_file(marker).rfind("ON", 0) != 0) {
    GTEST_SKIP() << "lockstep was built without a Fortran compiler (gfortran, which make test installs)";
  }
  testing::TempDir dir;
  testing::write_file(dir.file("run.yaml"), single_process_job());
  const std::string program = capi_program("capi_train_fortran");
  ASSERT_TRUE(testing::file_exists(program)) << program << " was not built although gfortran was found";
  const auto real4 = final_weights(dir, {program, dir.file("run.yaml"), dir.file("real4"), "20", "4", "real4"}, "real4");
  const auto real8 = final_weights(dir, {program, dir.file("run.yaml"), dir.file("real8"), "20", "4", "real8"}, "real8");
  EXPECT_TRUE(testing::bitwise_equal(real4, real8));
}

// capi_job.yaml sharded with FullyShard, its final checkpoint saved as DCP
// on a thread of its own (async_save), and no checkpoint before the final one.
std::string background_saving_job() {
  const std::string ddp = "strategy: {type: DDPStrategy, launcher: pytorch, backend: gloo}";
  std::string job = capi_job();
  job.replace(job.find(ddp), ddp.size(),
              "strategy:\n  type: FSDPStrategy\n  launcher: pytorch\n  backend: gloo\n  state_dict_type: dcp\n"
              "  async_save: true\n  model_wrapper: {type: FullyShard}");
  const std::string interval = "checkpoint: {interval: 20}";
  job.replace(job.find(interval), interval.size(), "checkpoint: {interval: 100}");
  return job;
}

// The program's last call (lockstep_trainer_destroy, StepTrainer::finish)
// ends the run as lockstep train does: it waits for the final checkpoint
// written in the background, so a save that failed on any rank is a status
// on every rank, not a line in a log beside exit status 0 and no checkpoint.
TEST(CApi, AFinalCheckpointThatFailsInTheBackgroundIsTheLastCallsStatus) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  testing::write_file(dir.file("run.yaml"), background_saving_job());
  testing::write_capi_training_data(dir.file("data.bin"), 20 * 8 * 2);

  auto saved = run_capi_train(dir, "saved");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  EXPECT_TRUE(testing::file_exists(dir.file("saved/model_final.dcp/.metadata"))) << saved.output;
  EXPECT_EQ(testing::read_file(dir.file("saved/last_checkpoint")), "model_final.ckpt");

  auto failed = run_capi_train(dir, "failed", {}, {"LOCKSTEP_FAULT_THROW_AT=write:__1_0.distcp", "LOCKSTEP_FAULT_RANK=1"});
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  for (const std::string rank : {"[rank0]", "[rank1]"}) {
    EXPECT_TRUE(contains(failed.output, rank + ": capi_train: lockstep_trainer_destroy failed")) << failed.output;
  }
  EXPECT_TRUE(contains(failed.output, "reached fault point 'write:__1_0.distcp'")) << failed.output;
  EXPECT_FALSE(testing::file_exists(dir.file("failed/last_checkpoint"))) << failed.output;
}

TEST(CApi, BadInputIsAStatusAndAMessageAndTheProgramGoesOn) {
  testing::TempDir dir;
  testing::write_file(dir.file("run.yaml"), single_process_job());
  testing::write_file(dir.file("bad.yaml"), capi_job() + "trian_cfg: {max_iters: 3}\n");
  auto result = testing::run_command({capi_program("capi_errors"), dir.file("run.yaml"), dir.file("bad.yaml"),
                                      dir.file("work")},
                                     {}, 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "capi_errors: 0 failed")) << result.output;
}

TEST(CApi, ARankThatPredictsWhileAnotherTrainsFailsBothAtOnceAndBothGoOn) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  testing::write_file(dir.file("run.yaml"), capi_job());
  auto result = testing::run_command(
      testing::launched(2, {}, {capi_program("capi_errors"), dir.file("run.yaml"), "-", dir.file("work"), "mismatch"}),
      {}, 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank0]: capi_errors: 0 failed")) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank1]: capi_errors: 0 failed")) << result.output;
  EXPECT_LT(result.seconds, 60) << "the mismatch must fail at once, not at the timeout";
}

}  // namespace
}  // namespace lockstep
