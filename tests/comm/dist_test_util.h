// Shared helpers of the multi-process dist tests.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "tests/support/multiprocess.h"

namespace lockstep::testing {

// The dtypes every collective is checked with.
inline std::vector<torch::ScalarType> tested_dtypes() {
  return {torch::kFloat, torch::kDouble, torch::kLong, torch::kBFloat16, torch::kHalf, torch::kShort};
}

// Compares exactly, in float64 (all test values are exact in every tested dtype).
inline ::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const torch::Tensor& expected) {
  auto a = actual.to(torch::kDouble).reshape(-1);
  auto e = expected.to(torch::kDouble).reshape(-1);
  if (a.sizes() == e.sizes() && torch::equal(a, e)) return ::testing::AssertionSuccess();
  std::ostringstream out;
  out << "actual " << actual.scalar_type() << " " << a.sizes() << ": " << a.slice(0, 0, 16)
      << "\nexpected " << e.sizes() << ": " << e.slice(0, 0, 16);
  return ::testing::AssertionFailure() << out.str();
}

// Standard settings for worker runs: a bounded wait so a broken test fails
// instead of hanging for torch's 30 minutes.
inline WorkersOptions worker_options(std::vector<std::string> env = {}) {
  WorkersOptions options;
  options.env = {"LOCKSTEP_TIMEOUT_S=60"};
  options.env.insert(options.env.end(), env.begin(), env.end());
  options.timeout_s = 150;
  return options;
}

// Runs every worker test `pattern` matches on `nproc` ranks with
// worker_options(env) and expects them all to pass.
//   TEST(Collectives, TwoRanks) { testing::expect_workers_pass(2, "CollectivesWorker.*"); }
inline void expect_workers_pass(int nproc, const std::string& pattern, const std::vector<std::string>& env = {}) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  const CommandResult result = run_workers(nproc, pattern, worker_options(env));
  EXPECT_WORKERS_OK(result) << "on " << nproc << " ranks";
}

}  // namespace lockstep::testing
