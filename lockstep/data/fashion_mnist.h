// FashionMNIST: the Zalando clothing images (60000 train, 10000 test, 10 classes).
//
// Reads the four IDX files from `root` (as installed by
// `apt-get install dataset-fashion-mnist`) and keeps them in memory, so a batch
// is one gather. Pixels stay uint8 in [0, 255]: normalisation belongs to the
// model's data preprocessor, which runs on the device.
//
//   lockstep::FashionMNIST train("/usr/share/datasets/fashion-mnist", "train");
//   lockstep::Batch batch = train.get_batch({0, 1}, 0);
//   batch.at("image");   // uint8 [2, 1, 28, 28]
//   batch.at("label");   // int64 [2], values 0..9
//
// In a config: `dataset: {type: FashionMNIST, root: /usr/share/datasets/fashion-mnist, split: test}`
// (root defaults to that path; split is required).
#pragma once

#include <string>

#include "lockstep/data/dataset.h"

namespace lockstep {

class FashionMNIST : public TensorDataset {
 public:
  static constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";
  static constexpr int64_t kNumClasses = 10;

  // `split` is "train" or "test". Files are looked up gzipped first, then
  // uncompressed (train-images-idx3-ubyte.gz, then train-images-idx3-ubyte).
  FashionMNIST(const std::string& root, const std::string& split);

  const std::string& split() const { return split_; }

 private:
  std::string split_;
};

}  // namespace lockstep
