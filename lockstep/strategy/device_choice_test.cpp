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

// LocalPlace{LOCAL_RANK, LOCAL_WORLD_SIZE}.
LocalPlace at(int rank, int of) { return LocalPlace{rank, of}; }

TEST(ChooseDevice, AutoIsTheRanksGpuWhenEveryLocalRankHasOne) {
  EXPECT_EQ(choose_device("auto", at(0, 1), 0, "d"), torch::Device(torch::kCPU));
  EXPECT_EQ(choose_device("auto", at(3, 4), 0, "d"), torch::Device(torch::kCPU));
  EXPECT_EQ(choose_device("auto", at(0, 4), 4, "d"), cuda(0));
  EXPECT_EQ(choose_device("auto", at(3, 4), 4, "d"), cuda(3));
  EXPECT_EQ(choose_device("auto", at(1, 2), 8, "d"), cuda(1));
  // No launcher (one process): the first GPU.
  EXPECT_EQ(choose_device("auto", LocalPlace(), 2, "d"), cuda(0));
}

TEST(ChooseDevice, AutoPutsEveryRankOnTheCpuWhenTheMachineHasTooFewGpus) {
  // The demo's 2 processes on a one-GPU workstation: both on the CPU, rank 0 included,
  // so that the two agree on Gloo.
  EXPECT_EQ(choose_device("auto", at(0, 2), 1, "d"), torch::Device(torch::kCPU));
  EXPECT_EQ(choose_device("auto", at(1, 2), 1, "d"), torch::Device(torch::kCPU));
  EXPECT_EQ(choose_device("auto", at(7, 8), 4, "d"), torch::Device(torch::kCPU));
}

TEST(ChooseDevice, AutoSaysWhyItChoseTheCpuAndHowToChoose) {
  EXPECT_THAT(auto_device_fallback("auto", at(0, 2), 1),
              AllOf(HasSubstr("2 processes on this machine and 1 GPU(s)"), HasSubstr("every rank runs on the CPU"),
                    HasSubstr("start 1 process per machine"), HasSubstr("strategy.device: cpu")));
  EXPECT_THAT(auto_device_fallback("auto", at(5, 8), 4), HasSubstr("at most 4 processes"));
  // Nothing to say where the GPUs suffice, where there are none, or where the device was chosen.
  EXPECT_EQ(auto_device_fallback("auto", at(1, 2), 2), "");
  EXPECT_EQ(auto_device_fallback("auto", at(1, 2), 0), "");
  EXPECT_EQ(auto_device_fallback("cpu", at(1, 2), 1), "");
  EXPECT_EQ(auto_device_fallback("cuda", at(1, 2), 1), "");
}

TEST(ChooseDevice, AutoWithAnUnknownLocalWorldKeepsToTheRanksOwnGpu) {
  // The launcher does not say how many ranks share the machine: neighbours
  // below the GPU count may have taken theirs, so a rank past them is an error.
  EXPECT_EQ(choose_device("auto", at(1, -1), 2, "d"), cuda(1));
  EXPECT_THAT(error_of([] { choose_device("auto", at(2, -1), 2, "strategy.device"); }),
              AllOf(HasSubstr("LOCAL_RANK 2"), HasSubstr("sees 2 GPU(s)")));
}

TEST(ChooseDevice, CudaIsTheRanksGpu) {
  EXPECT_EQ(choose_device("cuda", at(1, 2), 2, "d"), cuda(1));
  EXPECT_EQ(choose_device("cuda", LocalPlace(), 1, "d"), cuda(0));
}

TEST(ChooseDevice, CpuIsTheCpuWhateverTheGpus) {
  EXPECT_EQ(choose_device("cpu", at(5, 8), 8, "d"), torch::Device(torch::kCPU));
}

TEST(ChooseDevice, AnExplicitIndexIsKeptAndChecked) {
  EXPECT_EQ(choose_device("cuda:1", at(0, 1), 2, "d"), cuda(1));
  EXPECT_THAT(error_of([] { choose_device("cuda:2", at(0, 1), 2, "strategy.device"); }),
              AllOf(HasSubstr("strategy.device"), HasSubstr("'cuda:2'"), HasSubstr("sees 2 GPU(s)")));
}

TEST(ChooseDevice, AnExplicitCudaWithMoreRanksThanGpusIsAnErrorNotASharedGpu) {
  EXPECT_THAT(error_of([&] { choose_device("cuda", at(2, 3), 2, "run.yaml:7 strategy.device"); }),
              AllOf(HasSubstr("run.yaml:7 strategy.device"), HasSubstr("LOCAL_RANK 2"), HasSubstr("sees 2 GPU(s)"),
                    HasSubstr("one process per GPU")));
}

TEST(ChooseDevice, TheErrorNamesCudaVisibleDevicesWhenSet) {
  ::setenv("CUDA_VISIBLE_DEVICES", "5", 1);
  const std::string message = error_of([] { choose_device("cuda", at(1, 2), 1, "d"); });
  const std::string fallback = auto_device_fallback("auto", at(1, 2), 1);
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_THAT(message, HasSubstr("CUDA_VISIBLE_DEVICES=5"));
  EXPECT_THAT(fallback, HasSubstr("CUDA_VISIBLE_DEVICES=5"));
}

TEST(ChooseDevice, CudaWithoutGpusIsAnError) {
  EXPECT_THAT(error_of([] { choose_device("cuda", at(0, 1), 0, "strategy.device"); }),
              AllOf(HasSubstr("strategy.device"), HasSubstr("'cuda'"), HasSubstr("use device: cpu or auto")));
  EXPECT_THAT(error_of([] { choose_device("cuda:0", at(0, 1), 0, "strategy.device"); }), HasSubstr("'cuda:0'"));
}

TEST(ChooseDevice, UnknownNamesAreRejected) {
  for (const char* requested : {"gpu", "cuda:", "cuda:x", "cuda:-1", "mps", "CPU", ""}) {
    EXPECT_THAT(error_of([&] { choose_device(requested, at(0, 1), 2, "strategy.device"); }),
                AllOf(HasSubstr("strategy.device"), HasSubstr("is not a device")))
        << "'" << requested << "'";
  }
}

TEST(PlaceOnDevice, UsesTheGpusThisProcessSees) {
  if (compat::cuda_device_count() > 0) GTEST_SKIP() << "this test is about a machine without GPUs";
  EXPECT_EQ(place_on_device("auto", at(1, 2), "d"), torch::Device(torch::kCPU));
  EXPECT_THAT(error_of([] { place_on_device("cuda", at(0, 1), "d"); }), HasSubstr("'cuda'"));
  EXPECT_EQ(compat::current_cuda_device(), -1);
}

TEST(PlaceOnDevice, MakesTheChosenGpuCurrent) {
  if (compat::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int last = compat::cuda_device_count() - 1;
  EXPECT_EQ(place_on_device("auto", at(last, last + 1), "d"), cuda(last));
  EXPECT_EQ(compat::current_cuda_device(), last);
  place_on_device("cuda", at(0, 1), "d");
  EXPECT_EQ(compat::current_cuda_device(), 0);
}

TEST(BuildStrategy, NcclOnACpuDeviceIsRefusedBeforeAnyGroupExists) {
  Config config = parse_config("type: DDPStrategy\ndevice: cpu\nbackend: nccl\n", "run.yaml");
  EXPECT_THAT(error_of([&] { build_strategy(config); }),
              AllOf(HasSubstr("nccl"), HasSubstr("cpu"), HasSubstr("use backend gloo")));
}

TEST(BuildStrategy, ABadDeviceNameIsRefusedWithItsLine) {
  Config config = parse_config("type: DDPStrategy\ndevice: gpu0\n", "run.yaml");
  EXPECT_THAT(error_of([&] { build_strategy(config); }), AllOf(HasSubstr("run.yaml:2"), HasSubstr("'gpu0'")));
}

}  // namespace
}  // namespace lockstep
