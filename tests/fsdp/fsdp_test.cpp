// The FSDP worker tests (equivalence_test.cpp, checkpoint_test.cpp,
// amp_test.cpp) run in one launch per world size, 2 then 4 ranks, so the
// processes start once for every configuration. The 4-rank launch also reads
// what the 2-rank launch saved (a full checkpoint loads at another world size).
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>
#include <string>

#include "tests/support/multiprocess.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

TEST(Fsdp, WorkersOnTwoThenFourRanks) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  for (int nproc : {2, 4}) {
    testing::WorkersOptions options;
    options.env = {"FSDP_TEST_DIR=" + dir.path()};
    options.timeout_s = 500;
    auto result = testing::run_workers(nproc, "FsdpWorker.*", options);
    EXPECT_WORKERS_OK(result) << "on " << nproc << " ranks";
    if (result.exit_code != 0) break;  // the 4-rank launch needs the 2-rank launch's files
  }
}

// Sharded checkpoints written by 2 ranks, resumed on 1, 3 and 4 (checkpoint_test.cpp).
TEST(Fsdp, ShardedCheckpointsOfTwoRanksLoadOnOneThreeAndFour) {
  LOCKSTEP_REQUIRE_LAUNCHER();
  testing::TempDir dir;
  for (int nproc : {2, 1, 3, 4}) {
    testing::WorkersOptions options;
    options.env = {"FSDP_TEST_DIR=" + dir.path()};
    options.timeout_s = 300;
    auto result = testing::run_workers(nproc, "FsdpReshardWorker.*", options);
    EXPECT_WORKERS_OK(result) << "on " << nproc << " ranks";
    if (result.exit_code != 0 && nproc == 2) break;  // the others read what 2 ranks wrote
    std::istringstream lines(result.output);  // what each rank read, for the record
    for (std::string line; std::getline(lines, line);) {
      if (line.find(" bytes of saved shards") != std::string::npos) std::cout << line << "\n";
    }
  }
}

}  // namespace
}  // namespace lockstep
