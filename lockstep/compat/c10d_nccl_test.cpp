// NCCL's wait settings are pure logic: tested here on any machine, with the
// environment injected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "lockstep/compat/c10d.h"

namespace lockstep::compat {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using namespace std::chrono_literals;

std::function<const char*(const char*)> env_of(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const char* name) -> const char* {
    auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

TEST(NcclWaitSettings, TheWatchdogFiresAfterLockstepsOwnBoundedWait) {
  // At least 30 s later, or 10% of a long timeout: lockstep's message, naming
  // the late ranks, comes first; the watchdog is the backstop.
  EXPECT_EQ(nccl_wait_settings(60s, 2, 6, env_of({})).watchdog_timeout, 90s);
  EXPECT_EQ(nccl_wait_settings(30min, 2, 6, env_of({})).watchdog_timeout, 33min);
  EXPECT_GT(nccl_wait_settings(1s, 2, 6, env_of({})).watchdog_timeout, 1s);
}

TEST(NcclWaitSettings, BeforeLibtorch26BlockingWaitIsSetUnderTheNameEveryVersionReads) {
  EXPECT_THAT(nccl_wait_settings(60s, 2, 5, env_of({})).env_defaults, ElementsAre(Pair("NCCL_BLOCKING_WAIT", "1")));
  // 2.2+ reads the TORCH_ name first: a user's choice there is kept.
  auto kept = nccl_wait_settings(60s, 2, 3, env_of({{"TORCH_NCCL_BLOCKING_WAIT", "0"}}));
  EXPECT_THAT(kept.env_defaults, IsEmpty());
  EXPECT_THAT(kept.warnings, ElementsAre(HasSubstr("TORCH_NCCL_BLOCKING_WAIT=0")));
  // 2.0 and 2.1 know only NCCL_BLOCKING_WAIT.
  EXPECT_THAT(nccl_wait_settings(60s, 2, 1, env_of({{"TORCH_NCCL_BLOCKING_WAIT", "0"}})).env_defaults,
              ElementsAre(Pair("NCCL_BLOCKING_WAIT", "1")));
}

TEST(NcclWaitSettings, Libtorch26BlocksOnATimedWaitWithoutAnyEnvironment) {
  auto settings = nccl_wait_settings(60s, 2, 6, env_of({}));
  EXPECT_THAT(settings.env_defaults, IsEmpty());
  EXPECT_THAT(settings.warnings, IsEmpty());
}

TEST(NcclWaitSettings, Libtorch1NeedsBlockingWaitUnlessTheUserChoseOtherwise) {
  EXPECT_THAT(nccl_wait_settings(60s, 1, 13, env_of({})).env_defaults, ElementsAre(Pair("NCCL_BLOCKING_WAIT", "1")));
  auto kept = nccl_wait_settings(60s, 1, 13, env_of({{"NCCL_BLOCKING_WAIT", "1"}}));
  EXPECT_THAT(kept.env_defaults, IsEmpty());
  EXPECT_THAT(kept.warnings, IsEmpty());
  auto refused = nccl_wait_settings(60s, 1, 13, env_of({{"NCCL_BLOCKING_WAIT", "0"}}));
  EXPECT_THAT(refused.env_defaults, IsEmpty());
  EXPECT_THAT(refused.warnings, ElementsAre(HasSubstr("NCCL_BLOCKING_WAIT=0")));
}

TEST(NcclWaitSettings, AWatchdogTurnedOffIsReportedUnderThisVersionsName) {
  EXPECT_THAT(nccl_wait_settings(60s, 2, 6, env_of({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}})).warnings,
              ElementsAre(HasSubstr("TORCH_NCCL_ASYNC_ERROR_HANDLING=0")));
  EXPECT_THAT(nccl_wait_settings(60s, 1, 13, env_of({{"NCCL_ASYNC_ERROR_HANDLING", "0"}})).warnings,
              ElementsAre(HasSubstr("NCCL_ASYNC_ERROR_HANDLING=0")));
  EXPECT_THAT(nccl_wait_settings(60s, 2, 6, env_of({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}})).warnings, IsEmpty());
  EXPECT_THAT(nccl_wait_settings(60s, 3, 0, env_of({})).env_defaults, IsEmpty());
}

TEST(MakeNccl, WithoutNcclItSaysWhichLibtorchAndWhatToUse) {
  if (has_nccl()) GTEST_SKIP() << "this libtorch has NCCL";
  try {
    make_nccl(make_hash_store(), 0, 1, 60s);
    FAIL() << "make_nccl succeeded without NCCL";
  } catch (const std::exception& error) {
    EXPECT_THAT(error.what(), HasSubstr("use backend 'gloo'"));
  }
}

}  // namespace
}  // namespace lockstep::compat
