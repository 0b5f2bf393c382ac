#include "lockstep/parallel/ddp/bucket_assignment.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

TEST(BucketAssignmentTest, FirstBucketIsSmallThenLargeAndOrderedByReadiness) {
  // Six float32 parameters of 100 elements (400 bytes each).
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 6; ++i) params.push_back(torch::zeros({100}));
  auto buckets = assign_buckets(params, reverse_order(6), {400, 1000});
  // Reverse order 5,4,3,2,1,0: the first bucket closes at 400 bytes (one
  // parameter), the next ones at >= 1000 bytes (three parameters).
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{5}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{4, 3, 2}));
  EXPECT_EQ(buckets[2], (std::vector<size_t>{1, 0}));
}

TEST(BucketAssignmentTest, DtypesNeverShareABucket) {
  std::vector<torch::Tensor> params{torch::zeros({10}), torch::zeros({10}, torch::kDouble), torch::zeros({10}),
                                    torch::zeros({10}, torch::kDouble)};
  auto buckets = assign_buckets(params, {0, 1, 2, 3}, {1 << 20});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{0, 2}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{1, 3}));
}

TEST(BucketAssignmentTest, ObservedOrderDrivesTheRebuild) {
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 4; ++i) params.push_back(torch::zeros({256}));  // 1 KiB each
  auto buckets = assign_buckets(params, {2, 0, 3, 1}, {2048});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{2, 0}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{3, 1}));
}

TEST(BucketAssignmentTest, OrderMustBeAPermutation) {
  std::vector<torch::Tensor> params{torch::zeros({1}), torch::zeros({1})};
  EXPECT_THROW(assign_buckets(params, {0, 0}, {8}), Error);
  EXPECT_THROW(assign_buckets(params, {0}, {8}), Error);
  EXPECT_THROW(assign_buckets(params, {0, 1}, {}), Error);
}

}  // namespace
}  // namespace lockstep
