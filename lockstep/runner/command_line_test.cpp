#include "lockstep/runner/command_line.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

// parse_command_line over these arguments (argv[0] is "prog"), with what it printed to stderr.
struct Parsed {
  std::optional<CommandLine> command;
  std::string printed;
};
Parsed parse(std::vector<std::string> args, const std::vector<std::string>& program_flags = {}) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  ::testing::internal::CaptureStderr();
  Parsed parsed;
  try {
    parsed.command = parse_command_line(static_cast<int>(argv.size()), argv.data(), program_flags);
  } catch (...) {
    ::testing::internal::GetCapturedStderr();
    throw;
  }
  parsed.printed = ::testing::internal::GetCapturedStderr();
  return parsed;
}

class CommandLineTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_file(config_, "train_cfg: {max_iters: 3}\nwork_dir: from_config\n"); }
  testing::TempDir dir_;
  const std::string config_ = dir_.file("run.yaml");
};

TEST_F(CommandLineTest, ReadsTheConfigItsOverridesTheRunnerOptionsAndTheProgramsFlags) {
  auto parsed = parse({config_, "--set", "train_cfg.max_iters=7", "--work-dir", "w", "--resume", "--set",
                       "randomness={seed: 4}", "--sample-chars", "12", "--load-from", "init.ckpt"},
                      {"--sample-chars"});
  ASSERT_TRUE(parsed.command.has_value()) << parsed.printed;
  const CommandLine& command = *parsed.command;
  EXPECT_EQ(command.config.at("train_cfg").get<int64_t>("max_iters"), 7);
  EXPECT_EQ(command.config.at("randomness").get<int64_t>("seed"), 4);
  EXPECT_EQ(command.options.work_dir(), "w");
  EXPECT_TRUE(command.options.resume());
  EXPECT_EQ(command.options.load_from(), "init.ckpt");
  EXPECT_EQ(command.flag("--sample-chars", "400"), "12");
  EXPECT_EQ(command.flag("--other", "400"), "400");
  EXPECT_EQ(parsed.printed, "");
}

TEST_F(CommandLineTest, WithoutOptionsTheConfigStandsAsWritten) {
  auto parsed = parse({config_});
  ASSERT_TRUE(parsed.command.has_value());
  EXPECT_EQ(parsed.command->config.at("train_cfg").get<int64_t>("max_iters"), 3);
  EXPECT_EQ(parsed.command->options.work_dir(), "");
  EXPECT_FALSE(parsed.command->options.resume());
}

TEST_F(CommandLineTest, AnUnknownOrIncompleteOptionPrintsTheProblemAndTheUsage) {
  const std::string usage = "usage: prog CONFIG [--set key=value]... [--work-dir DIR] [--load-from PATH] [--resume]";
  auto unknown = parse({config_, "--sample-chars", "3"});
  EXPECT_FALSE(unknown.command.has_value());
  EXPECT_THAT(unknown.printed, HasSubstr("prog: unknown option '--sample-chars'\n" + usage + "\n"));
  auto incomplete = parse({config_, "--set"}, {"--sample-chars"});
  EXPECT_FALSE(incomplete.command.has_value());
  EXPECT_THAT(incomplete.printed, HasSubstr("option '--set' needs a value\n" + usage + " [--sample-chars VALUE]\n"));
  auto no_config = parse({"--resume"});
  EXPECT_FALSE(no_config.command.has_value());
  EXPECT_THAT(no_config.printed, HasSubstr("prog: the first argument names the config"));
  EXPECT_FALSE(parse({}).command.has_value());
}

TEST_F(CommandLineTest, ABadConfigOrOverrideIsAnErrorNamingIt) {
  EXPECT_THAT(testing::error_of([&] { parse({dir_.file("missing.yaml")}); }), HasSubstr("missing.yaml"));
  EXPECT_THAT(testing::error_of([&] { parse({config_, "--set", "train_cfg.max_iters"}); }),
              HasSubstr("train_cfg.max_iters"));
}

}  // namespace
}  // namespace lockstep
