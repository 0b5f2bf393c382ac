// Helpers for lockstep/config's tests: fixture paths and caught error messages.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_support.h"

namespace lockstep::config_test {

// A fixture under lockstep/config/testdata/, as the path messages will show.
inline std::string testdata(const std::string& name) {
  return testing::source_dir() + "/lockstep/config/testdata/" + name;
}

using ::lockstep::testing::error_of;

}  // namespace lockstep::config_test
