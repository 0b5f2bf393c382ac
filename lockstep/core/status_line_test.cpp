#include "lockstep/core/status_line.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace lockstep {
namespace {

// A StatusLine writing into a pipe, and what it wrote so far.
struct Captured {
  explicit Captured(StatusLine::Mode mode, int width = 40) {
    EXPECT_EQ(::pipe(fds), 0);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    line = std::make_unique<StatusLine>(fds[1], mode, width);
  }
  ~Captured() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  std::string take() {
    std::string out;
    char buffer[4096];
    for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) out.append(buffer, static_cast<size_t>(n));
    return out;
  }
  int fds[2];
  std::unique_ptr<StatusLine> line;
};

TEST(StatusLine, RedrawsInPlaceAndPrintsLinesWholeAboveIt) {
  Captured terminal(StatusLine::Mode::kTerminal);
  terminal.line->show("step 1");
  EXPECT_EQ(terminal.take(), "step 1");
  terminal.line->show("step 2");
  EXPECT_EQ(terminal.take(), "\r\033[Kstep 2");
  terminal.line->print_above("a log line\n");
  EXPECT_EQ(terminal.take(), "\r\033[Ka log line\nstep 2");
  terminal.line->clear();
  EXPECT_EQ(terminal.take(), "\r\033[K");
  terminal.line->print_above("after the end\n");  // nothing drawn: nothing to erase or redraw
  EXPECT_EQ(terminal.take(), "after the end\n");
}

TEST(StatusLine, CutsTheTextToOneLineNarrowerThanTheTerminal) {
  Captured terminal(StatusLine::Mode::kTerminal, /*width=*/10);
  terminal.line->show("0123456789abcdef\nsecond line");
  EXPECT_EQ(terminal.take(), "012345678");
}

TEST(StatusLine, OffWritesNothingAndPassesLinesThrough) {
  Captured off(StatusLine::Mode::kOff);
  EXPECT_FALSE(off.line->enabled());
  off.line->show("step 1");
  off.line->clear();
  off.line->print_above("a log line\n");
  EXPECT_EQ(off.take(), "a log line\n");
}

TEST(StatusLine, AWorkerSendsRecordsTheLauncherReads) {
  Captured worker(StatusLine::Mode::kRecords);
  worker.line->show("train 3/30");
  worker.line->print_above("a log line\n");
  worker.line->clear();
  const std::string sent = worker.take();
  EXPECT_EQ(sent, status_record("train 3/30") + "a log line\n" + status_record(""));
  EXPECT_EQ(parse_status_record(status_record("train 3/30")), "train 3/30");
  EXPECT_EQ(parse_status_record("[rank0]: " + status_record("x"), std::string("[rank0]: ").size()), "x");
  EXPECT_EQ(parse_status_record(status_record("")), "");
  EXPECT_EQ(parse_status_record("a log line"), std::nullopt);
  EXPECT_EQ(parse_status_record("[rank0]: " + status_record("x")), std::nullopt);  // not at the offset given
}

TEST(StatusLine, TheModeComesFromTheTerminalAndTheEnvironment) {
  using Mode = StatusLine::Mode;
  EXPECT_EQ(StatusLine::choose_mode(true, "xterm", nullptr, nullptr), Mode::kTerminal);
  EXPECT_EQ(StatusLine::choose_mode(true, nullptr, nullptr, nullptr), Mode::kTerminal);
  EXPECT_EQ(StatusLine::choose_mode(true, "dumb", nullptr, nullptr), Mode::kOff);
  EXPECT_EQ(StatusLine::choose_mode(false, "xterm", nullptr, nullptr), Mode::kOff);  // a pipe, a file
  EXPECT_EQ(StatusLine::choose_mode(false, "xterm", "launcher", nullptr), Mode::kRecords);
  EXPECT_EQ(StatusLine::choose_mode(true, "xterm", nullptr, "0"), Mode::kOff);
  EXPECT_EQ(StatusLine::choose_mode(false, "xterm", "launcher", "0"), Mode::kOff);
}

}  // namespace
}  // namespace lockstep
