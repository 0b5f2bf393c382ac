#include "lockstep/strategy/device_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "lockstep/compat/cuda.h"
#include "lockstep/config/config.h"
#include "lockstep/strategy/strategy.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::lockstep::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

torch::Device cuda(int index) { return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index)); }

TEST(ChooseDevice, AutoIsTheRanksGpuWhenThereAreGpusAndTheCpuOtherwise) {
  EXPECT_EQ(choose_device("auto", 0, 0, "d"), torch::Device(torch::kCPU));
  EXPECT_EQ(choose_device("auto", 3, 0, "d"), torch::Device(torch::kCPU));
  EXPECT_EQ(choose_device("auto", 0, 4, "d"), cuda(0));
  EXPECT_EQ(choose_device("auto", 3, 4, "d"), cuda(3));
  // No LOCAL_RANK (an explicit init, one process): the first GPU.
  EXPECT_EQ(choose_device("auto", -1, 2, "d"), cuda(0));
}

TEST(ChooseDevice, CudaIsTheRanksGpu) {
  EXPECT_EQ(choose_device("cuda", 1, 2, "d"), cuda(1));
  EXPECT_EQ(choose_device("cuda", -1, 1, "d"), cuda(0));
}

TEST(ChooseDevice, CpuIsTheCpuWhateverTheGpus) {
  EXPECT_EQ(choose_device("cpu", 5, 8, "d"), torch::Device(torch::kCPU));
}

TEST(ChooseDevice, AnExplicitIndexIsKeptAndChecked) {
  EXPECT_EQ(choose_device("cuda:1", 0, 2, "d"), cuda(1));
  EXPECT_THAT(error_of([] { choose_device("cuda:2", 0, 2, "strategy.device"); }),
              AllOf(HasSubstr("strategy.device"), HasSubstr("'cuda:2'"), HasSubstr("sees 2 GPU(s)")));
}

TEST(ChooseDevice, MoreRanksOnAMachineThanGpusIsAnErrorNotASharedGpu) {
  for (const char* requested : {"auto", "cuda"}) {
    EXPECT_THAT(error_of([&] { choose_device(requested, 2, 2, "run.yaml:7 strategy.device"); }),
                AllOf(HasSubstr("run.yaml:7 strategy.device"), HasSubstr("LOCAL_RANK 2"), HasSubstr("sees 2 GPU(s)"),
                      HasSubstr("one process per GPU")))
        << requested;
  }
}

TEST(ChooseDevice, TheErrorNamesCudaVisibleDevicesWhenSet) {
  ::setenv("CUDA_VISIBLE_DEVICES", "5", 1);
  const std::string message = error_of([] { choose_device("auto", 1, 1, "d"); });
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_THAT(message, HasSubstr("CUDA_VISIBLE_DEVICES=5"));
}

TEST(ChooseDevice, CudaWithoutGpusIsAnError) {
  EXPECT_THAT(error_of([] { choose_device("cuda", 0, 0, "strategy.device"); }),
              AllOf(HasSubstr("strategy.device"), HasSubstr("'cuda'"), HasSubstr("use device: cpu or auto")));
  EXPECT_THAT(error_of([] { choose_device("cuda:0", 0, 0, "strategy.device"); }), HasSubstr("'cuda:0'"));
}

TEST(ChooseDevice, UnknownNamesAreRejected) {
  for (const char* requested : {"gpu", "cuda:", "cuda:x", "cuda:-1", "mps", "CPU", ""}) {
    EXPECT_THAT(error_of([&] { choose_device(requested, 0, 2, "strategy.device"); }),
                AllOf(HasSubstr("strategy.device"), HasSubstr("is not a device")))
        << "'" << requested << "'";
  }
}

TEST(PlaceOnDevice, UsesTheGpusThisProcessSees) {
  if (compat::cuda_device_count() > 0) GTEST_SKIP() << "this test is about a machine without GPUs";
  EXPECT_EQ(place_on_device("auto", 1, "d"), torch::Device(torch::kCPU));
  EXPECT_THAT(error_of([] { place_on_device("cuda", 0, "d"); }), HasSubstr("'cuda'"));
  EXPECT_EQ(compat::current_cuda_device(), -1);
}

TEST(PlaceOnDevice, MakesTheChosenGpuCurrent) {
  if (compat::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int last = compat::cuda_device_count() - 1;
  EXPECT_EQ(place_on_device("auto", last, "d"), cuda(last));
  EXPECT_EQ(compat::current_cuda_device(), last);
  place_on_device("cuda", 0, "d");
  EXPECT_EQ(compat::current_cuda_device(), 0);
}

TEST(BuildStrategy, NcclOnACpuDeviceIsRefusedBeforeAnyGroupExists) {
  Config config = Config::parse("type: DDPStrategy\ndevice: cpu\nbackend: nccl\n", "run.yaml");
  EXPECT_THAT(error_of([&] { build_strategy(config); }),
              AllOf(HasSubstr("nccl"), HasSubstr("cpu"), HasSubstr("use backend gloo")));
}

TEST(BuildStrategy, ABadDeviceNameIsRefusedWithItsLine) {
  Config config = Config::parse("type: DDPStrategy\ndevice: gpu0\n", "run.yaml");
  EXPECT_THAT(error_of([&] { build_strategy(config); }), AllOf(HasSubstr("run.yaml:2"), HasSubstr("'gpu0'")));
}

}  // namespace
}  // namespace lockstep
