// Resuming past a damaged newest checkpoint keeps the promise of a bitwise
// resume: the run goes on with the seed of the checkpoint it actually resumes
// (a config without a seed draws one at start and records it in every
// checkpoint), so shuffled data come in the order the interrupted run had.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "tests/support/small_job.h"

namespace lockstep {
namespace {

using testing::contains;

// The seeds "Work dir ...; seed N; strategy ..." lines name, in order.
std::vector<std::string> logged_seeds(const std::string& output) {
  std::vector<std::string> seeds;
  std::regex line(R"(; seed (\d+); strategy)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    seeds.push_back((*it)[1]);
  }
  return seeds;
}

void flip_bytes_in_the_middle(const std::string& path) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(0, std::ios::end);
  const std::streamoff middle = file.tellg() / 2;
  file.seekp(middle);
  const char garbage[4] = {'\x5a', '\x5a', '\x5a', '\x5a'};
  file.write(garbage, sizeof(garbage));
}

TEST(ResumeChoice, FallingBackPastADamagedCheckpointKeepsItsSeedAndEndsBitwiseEqual) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  const std::string config = testing::write_small_job(dir);
  const std::string run = dir.file("run");
  // Shuffled data, no seed: one is drawn at start.
  const std::vector<std::string> no_seed{testing::ddp_strategy_line(), "randomness=null"};
  auto with = [](std::vector<std::string> sets, const std::string& extra) {
    sets.push_back(extra);
    return sets;
  };

  auto interrupted = testing::run_command(
      testing::launched(2, {}, testing::train_argv(config, run, with(no_seed, "custom_hooks=[{type: FaultInjection, "
                                                                               "kill_at_iter: 22, rank: 1, attempt: 0}]"))),
      {}, 180);
  ASSERT_NE(interrupted.exit_code, 0) << interrupted.output;
  const auto started = logged_seeds(interrupted.output);
  ASSERT_FALSE(started.empty()) << interrupted.output;
  ASSERT_EQ(testing::read_file(run + "/last_checkpoint"), "model_0000019.ckpt");
  flip_bytes_in_the_middle(run + "/model_0000019.ckpt");

  auto resumed = testing::run_command(
      testing::launched(2, {}, with(testing::train_argv(config, run, no_seed), "--resume")), {}, 180);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "Skipping checkpoint " + run + "/model_0000019.ckpt")) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "Resuming from " + run + "/model_0000014.ckpt")) << resumed.output;
  const auto seeds = logged_seeds(resumed.output);
  ASSERT_FALSE(seeds.empty()) << resumed.output;
  EXPECT_EQ(seeds.front(), started.front()) << "the resumed run must use the seed of the checkpoint it resumes";

  const std::string straight = dir.file("straight");
  auto uninterrupted = testing::run_command(
      testing::launched(2, {}, testing::train_argv(config, straight, {testing::ddp_strategy_line(),
                                                                      "randomness.seed=" + started.front()})),
      {}, 180);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  EXPECT_TRUE(testing::bitwise_equal(testing::checkpoint_weights(straight + "/model_final.ckpt"),
                                     testing::checkpoint_weights(run + "/model_final.ckpt")));
}

}  // namespace
}  // namespace lockstep
