#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "tests/support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace {

TEST(ErrorTest, CheckBuildsMessageFromParts) {
  try {
    LOCKSTEP_CHECK(1 + 1 == 3, "key ", "a.b", ": expected ", 3, ", got ", 2);
    FAIL() << "LOCKSTEP_CHECK did not throw";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "key a.b: expected 3, got 2");
  }
}

TEST(ErrorTest, AssertSaysItIsABugAndWhere) {
  const int phase = 2;
  EXPECT_THROW(LOCKSTEP_ASSERT(phase == 1, "phase ", phase), InternalError);
  const std::string message = testing::error_of([&] { LOCKSTEP_ASSERT(phase == 1, "phase ", phase); });
  EXPECT_NE(message.find("lockstep internal error (a bug in lockstep"), std::string::npos) << message;
  EXPECT_NE(message.find("error_test.cpp:"), std::string::npos) << message;
  EXPECT_NE(message.find("phase == 1: phase 2"), std::string::npos) << message;
  EXPECT_NO_THROW(LOCKSTEP_ASSERT(phase == 2, "never"));
}

TEST(ErrorTest, RethrowWithContextKeepsOnlyTorchsFirstLine) {
  try {
    try {
      torch::ones({2, 3}).matmul(torch::ones({2, 3}));
    } catch (...) {
      rethrow_with_context("layer fc1");
    }
    FAIL() << "no exception";
  } catch (const Error& error) {
    std::string message = error.what();
    EXPECT_EQ(message.rfind("layer fc1: ", 0), 0u) << message;
    EXPECT_EQ(message.find("Exception raised from"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace lockstep
