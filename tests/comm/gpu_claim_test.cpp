// check_one_rank_per_gpu (comm/gpu_claim.h): ranks that share a GPU are told
// so, the others go on. Ranks are threads over one in-process store, as the
// check only talks to the store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "lockstep/comm/gpu_claim.h"

namespace lockstep {
namespace {

// Runs the check on one thread per rank; returns each rank's error ("" when it returned).
std::vector<std::string> claim(const std::vector<std::string>& uuids) {
  auto store = compat::make_hash_store();
  const int size = static_cast<int>(uuids.size());
  std::vector<std::string> errors(uuids.size());
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        check_one_rank_per_gpu(store, rank, size, uuids[rank], "cuda:0 (Test GPU)", std::chrono::seconds(20));
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& thread : ranks) thread.join();
  return errors;
}

TEST(GpuClaim, RanksOnTheirOwnGpusGoOn) {
  EXPECT_THAT(claim({"GPU-a", "GPU-b", "GPU-c"}), ::testing::Each(""));
  EXPECT_THAT(claim({"GPU-a"}), ::testing::Each(""));
}

TEST(GpuClaim, EveryRankOnASharedGpuIsToldAndNoOtherIs) {
  const auto errors = claim({"GPU-a", "GPU-b", "GPU-a", "GPU-a"});
  EXPECT_EQ(errors[1], "");
  for (int rank : {0, 2, 3}) {
    EXPECT_THAT(errors[rank], ::testing::HasSubstr("rank " + std::to_string(rank) +
                                                   ": backend nccl: 3 ranks of this job share GPU cuda:0 (Test GPU) (GPU-a)"));
    EXPECT_THAT(errors[rank], ::testing::HasSubstr("use backend gloo"));
  }
}

}  // namespace
}  // namespace lockstep
