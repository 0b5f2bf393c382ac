// The FSDP worker tests (equivalence_test.cpp, checkpoint_test.cpp,
// amp_test.cpp) run in one launch per world size, 2 then 4 ranks, so the
// processes start once for every configuration. The 4-rank launch also reads
// what the 2-rank launch saved (a sharded checkpoint must refuse to load on
// another world size; a full one must not).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace lockstep
