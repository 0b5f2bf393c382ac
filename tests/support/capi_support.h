// What the tests of lockstep's C API share: the data file
// tests/capi/capi_train.c trains on -- the first `samples` Fashion-MNIST
// training images as float32 pixels (0..255, unnormalised, as lockstep's
// FashionMNIST gives them) and their labels as int32,
//   int64 N | N x 1 x 28 x 28 float32 | N int32
// -- and how to start a program under Open MPI's mpirun (tests/support/mpirun.h).
//
//   lockstep::testing::write_capi_training_data(dir.file("data.bin"), 640);
//   if (auto problem = lockstep::testing::mpirun_problem(); !problem.empty()) GTEST_SKIP() << problem;
//   auto argv = lockstep::testing::mpirun_command(2, {program, config}, /*use_communicator=*/true);
//
// Header-only, so that any test binary can use it without build changes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "lockstep/core/error.h"
#include "lockstep/data/fashion_mnist.h"
#include "tests/support/mpirun.h"
#include "tests/support/test_support.h"

namespace lockstep::testing {

inline void write_capi_training_data(const std::string& path, int64_t samples) {
  FashionMNIST dataset(FashionMNIST::kDefaultRoot, "train");
  std::vector<int64_t> indices(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) indices[static_cast<size_t>(i)] = i;
  Batch batch = dataset.get_batch(indices, 0);
  const torch::Tensor images = batch.at("image").to(torch::kFloat).contiguous();
  const torch::Tensor labels = batch.at("label").to(torch::kInt).contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&samples), sizeof samples);
  out.write(reinterpret_cast<const char*>(images.data_ptr<float>()), images.numel() * sizeof(float));
  out.write(reinterpret_cast<const char*>(labels.data_ptr<int32_t>()), labels.numel() * sizeof(int32_t));
  LOCKSTEP_CHECK(out.good(), "cannot write the C API test data to ", path);
}

}  // namespace lockstep::testing
