#include "lockstep/compat/cuda_graph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/compat/cuda.h"
#include "lockstep/core/error.h"

namespace lockstep::compat {
namespace {

using ::testing::HasSubstr;

TEST(LastOperationTest, NamesTheOperatorAHostReadRuns) {
  torch::Tensor value = torch::ones({3}).sum();
  std::string name;
  {
    LastOperation last;
    (void)value.item<float>();
    name = last.name();
  }
  // .item() is what a capture refuses most often; the message must say so.
  EXPECT_EQ(name, "aten::_local_scalar_dense");
  LastOperation fresh;
  EXPECT_EQ(fresh.name(), "") << "a new watch starts empty";
}

TEST(CaptureFailureMessageTest, NamesTheOperationTheErrorAndWhatACaptureForbids) {
  const std::string message = capture_failure_message(
      "CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors might be ...",
      "aten::_local_scalar_dense");
  EXPECT_THAT(message, HasSubstr("cuda_graph: the training step could not be captured"));
  EXPECT_THAT(message, HasSubstr("(the last operation it started: aten::_local_scalar_dense)"));
  EXPECT_THAT(message, HasSubstr("operation not permitted when stream is capturing"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("CUDA kernel errors might be")));
  EXPECT_THAT(message, HasSubstr(".item()"));
  EXPECT_THAT(message, HasSubstr("or train without cuda_graph"));
  EXPECT_THAT(capture_failure_message("boom", ""), ::testing::Not(HasSubstr("last operation")));
}

TEST(CudaGraphTest, ACpuBuildRefusesToCaptureAndRunsSideStreamWorkInPlace) {
  EXPECT_FALSE(current_stream_capturing() && !built_with_cuda());
  int ran = 0;
  run_on_side_stream([&] { ++ran; });
  EXPECT_EQ(ran, 1);
  if (built_with_cuda()) GTEST_SKIP() << "a CUDA build captures; gpu-check's cuda-graph step runs that";
  CudaGraph graph;
  try {
    graph.capture([] {});
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("built without CUDA"));
  }
  EXPECT_FALSE(graph.captured());
}

}  // namespace
}  // namespace lockstep::compat
