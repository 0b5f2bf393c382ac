// Checks that a call fails with lockstep's internal error (LOCKSTEP_ASSERT's
// InternalError: a bug in lockstep, not the user's mistake) and that its
// message holds a given text, for the tests of the stage machines that report
// a move they do not have as one.
//
//   lockstep::testing::expect_internal_error([&] { move_optim_step_phase(phase, Phase::kReduced); },
//                                            "the optim wrapper's step has no move from failed to reduced");
//
// Header-only, so that any test binary can use it without build changes.
#pragma once

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "lockstep/core/internal/internal_error.h"

namespace lockstep::testing {

inline void expect_internal_error(const std::function<void()>& action, const std::string& says) {
  try {
    action();
  } catch (const InternalError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("lockstep internal error"), std::string::npos) << message;
    EXPECT_NE(message.find(says), std::string::npos) << message;
    return;
  } catch (const std::exception& other) {
    ADD_FAILURE() << "expected an internal error saying \"" << says << "\", got: " << other.what();
    return;
  }
  ADD_FAILURE() << "expected an internal error saying \"" << says << "\", got none";
}

}  // namespace lockstep::testing
