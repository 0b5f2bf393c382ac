// The progress bar as a user sees it: `lockstep train` in a real terminal (a
// pseudo-terminal made by util-linux's `script`), alone and under the
// launcher, and the same runs into a pipe, where nothing may change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <regex>
#include <sstream>

#include "tests/support/small_job.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using testing::run_command;

const char kErase[] = "\r\033[K";

// A shell word for `script -c`.
std::string quoted(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Why no pseudo-terminal can be made here (empty when one can).
std::string no_terminal() {
  static const std::string problem = [] {
    auto probe = run_command({"script", "--quiet", "--return", "--command", "true", "/dev/null"}, {"TERM=xterm"}, 60);
    return probe.exit_code == 0 ? std::string() : "util-linux's script cannot make a pseudo-terminal here: " + probe.output;
  }();
  return problem;
}

// `argv` run with its stdout and stderr on a pseudo-terminal; what the terminal received.
testing::CommandResult in_terminal(const std::vector<std::string>& argv) {
  std::string command;
  for (const auto& word : argv) command += (command.empty() ? "" : " ") + quoted(word);
  return run_command({"script", "--quiet", "--return", "--command", command, "/dev/null"}, {"TERM=xterm"}, 240);
}

// The small job, redrawing at every step so that a short run draws many times.
std::vector<std::string> small_train(const testing::TempDir& dir, const std::string& work,
                                     std::vector<std::string> sets = {}) {
  sets.push_back("default_hooks.progress.refresh_s=0.0001");
  return testing::train_argv(testing::write_small_job(dir), dir.file(work), sets);
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// Every log line reached the terminal whole: a status draw is only ever
// erased before a log line is written, never written into one. So after
// the erase sequences are taken out, each log line stands on a line of its
// own, from its "[MM/DD" start to its end.
void expect_log_lines_whole(const std::string& terminal, const std::string& status_start) {
  std::string rest = terminal;
  std::vector<std::string> pieces;
  for (size_t at; (at = rest.find(kErase)) != std::string::npos;) {
    pieces.push_back(rest.substr(0, at));
    rest = rest.substr(at + std::strlen(kErase));
  }
  pieces.push_back(rest);
  const std::regex log_line(R"(\[\d\d/\d\d \d\d:\d\d:\d\d )");
  for (const auto& piece : pieces) {
    // A piece is a status text, or whole lines (maybe followed by a redrawn status).
    if (piece.rfind(status_start, 0) == 0) {
      EXPECT_EQ(piece.find('\n'), std::string::npos) << "a status text with a line break: " << piece;
      continue;
    }
    std::smatch found;
    std::string lines = piece.substr(0, piece.rfind('\n') == std::string::npos ? 0 : piece.rfind('\n') + 1);
    for (auto it = std::sregex_iterator(lines.begin(), lines.end(), log_line); it != std::sregex_iterator(); ++it) {
      const size_t start = static_cast<size_t>(it->position());
      EXPECT_TRUE(start == 0 || lines[start - 1] == '\n' || lines[start - 1] == ' ')
          << "a log line that does not start a line:\n" << lines;
      EXPECT_EQ(lines.substr(start, lines.find('\n', start) - start).find(status_start), std::string::npos)
          << "a status text inside a log line:\n" << lines;
    }
  }
}

TEST(ProgressBar, RedrawsInPlaceOnATerminalWithLogLinesWholeAbove) {
  if (auto problem = no_terminal(); !problem.empty()) GTEST_SKIP() << problem;
  testing::TempDir dir;
  auto result = in_terminal(small_train(dir, "work"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // Drawn, and drawn again in place (erased first), many times.
  EXPECT_GE(count(result.output, std::string(kErase) + "train epoch "), 10u) << result.output;
  // The whole line within the 80 columns of a terminal that gives no size.
  const std::regex last_line(R"(train epoch 3/3 30/30 \[##########\] 100% eta 0:00:00 loss [0-9.e-]+ lr [0-9.e-]+)");
  EXPECT_TRUE(std::regex_search(result.output, last_line)) << result.output;
  // The console writer's lines (every 10 iterations and at the end), whole, above it.
  EXPECT_EQ(count(result.output, "iter: "), 4u) << result.output;
  expect_log_lines_whole(result.output, "train ");
  // Nothing is left drawn at the end: the last thing written erases the bar.
  const size_t last_status = result.output.rfind("train ");
  EXPECT_NE(result.output.find(kErase, last_status), std::string::npos) << "the bar was left on the terminal";
}

TEST(ProgressBar, TheLauncherDrawsRankZerosBarAboveWhichItsRanksPrint) {
  if (auto problem = no_terminal(); !problem.empty()) GTEST_SKIP() << problem;
  testing::TempDir dir;
  auto result = in_terminal(testing::launched(2, {}, small_train(dir, "work", {testing::ddp_strategy_line()})));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_GE(count(result.output, std::string(kErase) + "train "), 5u) << result.output;
  EXPECT_EQ(result.output.find("lockstep-status"), std::string::npos) << "a status record reached the terminal";
  EXPECT_NE(result.output.find("[rank0]: "), std::string::npos) << result.output;
  expect_log_lines_whole(result.output, "train ");
}

TEST(ProgressBar, APipeGetsTheSameLinesAsWithoutABar) {
  // The same run with the bar on (the default) and off: into a pipe both give
  // the same lines, once timings, dates and the work dir are set aside.
  testing::TempDir dir;
  // Digits set aside; under the launcher the ranks' lines interleave as they
  // come, so their order is set aside too (sorted).
  auto normalised = [](std::string text, bool sort_lines) {
    text = std::regex_replace(text, std::regex(R"([0-9])"), "0");
    if (!sort_lines) return text;
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    std::sort(lines.begin(), lines.end());
    std::string sorted;
    for (const auto& line : lines) sorted += line + "\n";
    return sorted;
  };
  for (int nproc : {1, 2}) {
    std::vector<std::string> outputs;
    for (const char* progress : {"{}", "false"}) {
      run_command({"rm", "-rf", dir.file("work")});
      std::vector<std::string> sets{std::string("default_hooks.progress=") + progress};
      if (nproc > 1) sets.push_back(testing::ddp_strategy_line());
      auto argv = testing::train_argv(testing::write_small_job(dir), dir.file("work"), sets);
      if (nproc > 1) argv = testing::launched(nproc, {}, argv);
      auto result = run_command(argv, {"TERM=xterm"}, 240);
      ASSERT_EQ(result.exit_code, 0) << result.output;
      EXPECT_EQ(result.output.find('\r'), std::string::npos) << result.output;
      EXPECT_EQ(result.output.find('\033'), std::string::npos) << result.output;
      outputs.push_back(normalised(result.output, nproc > 1));
    }
    EXPECT_EQ(outputs[0], outputs[1]) << nproc << " process(es)";
  }
}

TEST(ProgressBar, FalseOrNullTurnsItOffOnATerminal) {
  if (auto problem = no_terminal(); !problem.empty()) GTEST_SKIP() << problem;
  testing::TempDir dir;
  // From the command line (a null there removes the key: the default), and in the YAML.
  auto off = in_terminal(testing::train_argv(testing::write_small_job(dir), dir.file("off"),
                                             {"default_hooks.progress=false"}));
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(off.output.find(kErase), std::string::npos) << off.output;
  EXPECT_EQ(count(off.output, "iter: "), 4u) << off.output;
  const std::string config = dir.file("no_bar.yaml");
  testing::write_file(config, "_base_: " + testing::write_small_job(dir) + "\ndefault_hooks: {progress: null}\n");
  auto null_off = in_terminal(testing::train_argv(config, dir.file("null_off")));
  ASSERT_EQ(null_off.exit_code, 0) << null_off.output;
  EXPECT_EQ(null_off.output.find(kErase), std::string::npos) << null_off.output;
}

}  // namespace
}  // namespace lockstep
