// SyntheticImages: a deterministic image classification dataset made up on
// the spot, for tests, benchmarks and smoke runs that must not depend on
// files. Each class has its own mean pattern; samples are that pattern plus
// noise, so a model can actually learn them.
//
//   train_dataloader:
//     batch_size: 64
//     dataset: {type: SyntheticImages, size: 1024, channels: 1, height: 28, width: 28,
//               num_classes: 10, seed: 0}
#pragma once

#include <cstdint>

#include "lockstep/data/dataset.h"

namespace lockstep {

struct SyntheticImagesOptions {
  TORCH_ARG(int64_t, size) = 1024;
  TORCH_ARG(int64_t, channels) = 1;
  TORCH_ARG(int64_t, height) = 28;
  TORCH_ARG(int64_t, width) = 28;
  TORCH_ARG(int64_t, num_classes) = 10;
  TORCH_ARG(uint64_t, seed) = 0;
};

// "image" uint8 [N, C, H, W] and "label" int64 [N], like FashionMNIST.
class SyntheticImages : public TensorDataset {
 public:
  explicit SyntheticImages(const SyntheticImagesOptions& options);
};

}  // namespace lockstep
