// The CUDA runtime seam. Where this libtorch has CUDA and a GPU is visible
// (scripts/gpu-check.sh's unit step), the counter counts real waits;
// elsewhere it must count nothing and say so.
#include "lockstep/compat/cuda.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep::compat {
namespace {

TEST(CudaSyncCounter, WithoutAGpuThereIsNothingToCount) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  CudaSyncCounter syncs;
  EXPECT_FALSE(syncs.counting());
  synchronize_cuda(0);  // no such device: nothing happens, nothing counts
  EXPECT_EQ(syncs.count(), 0);
}

// Note [Counting host synchronisations]: an implicit wait (.item(), a copy to
// the host) counts once, an explicit synchronize_cuda once, and work that
// stays on the GPU not at all.
TEST(CudaSyncCounter, CountsImplicitAndExplicitWaitsOnTheGpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
  const torch::Device gpu(torch::kCUDA, 0);
  torch::Tensor x = torch::randn({256, 256}, gpu);
  synchronize_cuda(0);
  CudaSyncCounter syncs;
  ASSERT_TRUE(syncs.counting());
  for (int i = 0; i < 10; ++i) x = torch::tanh(x.matmul(x) * 1e-3);  // queued, never waited for
  EXPECT_EQ(syncs.count(), 0);
  (void)x.sum().item<float>();
  EXPECT_EQ(syncs.count(), 1);
  (void)x.to(torch::kCPU);
  EXPECT_EQ(syncs.count(), 2);
  synchronize_cuda(0);
  EXPECT_EQ(syncs.count(), 3);
  syncs.reset();
  EXPECT_EQ(syncs.count(), 0);
}

TEST(CudaSyncCounter, OneAtATimeAndTheDebugModeEndsWithIt) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
  {
    CudaSyncCounter first;
    EXPECT_THROW(CudaSyncCounter second, std::exception);
  }
  CudaSyncCounter again;  // the first one's end freed the place
  EXPECT_TRUE(again.counting());
}

}  // namespace
}  // namespace lockstep::compat
