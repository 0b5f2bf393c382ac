#include "lockstep/core/stop_signals.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "tests/support/test_support.h"

namespace lockstep {
namespace {

TEST(StopSignals, TheFirstSignalIsAFlagAndTheHandlersAreRestoredAfterwards) {
  struct sigaction before {};
  sigaction(SIGUSR2, nullptr, &before);
  {
    StopSignals signals({SIGUSR2}, /*grace_seconds=*/0);
    EXPECT_EQ(StopSignals::received(), 0);
    raise(SIGUSR2);  // the process goes on
    EXPECT_EQ(StopSignals::received(), SIGUSR2);
    {
      StopSignals second({SIGUSR1}, 0);  // shares the first's handlers and flag
      EXPECT_EQ(StopSignals::received(), SIGUSR2);
    }
    struct sigaction still {};
    sigaction(SIGUSR2, nullptr, &still);
    EXPECT_NE(still.sa_handler, before.sa_handler);  // the first is still alive
  }
  struct sigaction after {};
  sigaction(SIGUSR2, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  StopSignals fresh({SIGUSR2}, 0);
  EXPECT_EQ(StopSignals::received(), 0);
}

TEST(StopSignals, SignalsAreReadByNameOrNumberAndOthersAreRefusedWithTheKey) {
  EXPECT_EQ(parse_signal("SIGTERM", "k"), SIGTERM);
  EXPECT_EQ(parse_signal("usr1", "k"), SIGUSR1);
  EXPECT_EQ(parse_signal("SigUsr2", "k"), SIGUSR2);
  EXPECT_EQ(parse_signal("15", "k"), SIGTERM);
  for (const char* bad : {"SIGKILL", "9", "CONT", "", "TERMINATE", "1000"}) {
    EXPECT_NE(testing::error_of([&] { parse_signal(bad, "run.yaml:3: preemption.signals[0]"); })
                  .find("run.yaml:3: preemption.signals[0]: '" + std::string(bad) + "' is not a signal a job can catch"),
              std::string::npos)
        << bad;
  }
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
}

}  // namespace
}  // namespace lockstep
