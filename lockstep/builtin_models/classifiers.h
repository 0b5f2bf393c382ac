// Built-in image classifiers, registered for configs (and used by the demo,
// tests and benchmarks): a small ConvNet and an MLP, both trained with
// cross-entropy ("loss_cls") and predicting "logits" from "image"/"label".
//
//   model:
//     type: ConvNet            # conv(in->c1)+BN+ReLU+pool, conv(c1->c2)+BN+ReLU+pool, fc(hidden), fc(classes)
//     channels: [32, 64]
//     hidden: 128
//     num_classes: 10
//     batch_norm: true
//   model: {type: MLP, in_features: 784, hidden: [2048, 2048, 2048], num_classes: 10}
#pragma once

#include <vector>

#include <torch/torch.h>

#include "lockstep/model/model.h"

namespace lockstep {

// Shared by the classifiers: cross-entropy on "label", logits from forward().
class ImageClassifier : public Model {
 public:
  virtual torch::Tensor forward(const torch::Tensor& image) = 0;
  LossDict loss(const Batch& data) override;
  Batch predict(const Batch& data) override;
};

struct ConvNetOptions {
  TORCH_ARG(int64_t, in_channels) = 1;
  TORCH_ARG(int64_t, image_size) = 28;
  TORCH_ARG(std::vector<int64_t>, channels) = std::vector<int64_t>{32, 64};
  TORCH_ARG(int64_t, hidden) = 128;
  TORCH_ARG(int64_t, num_classes) = 10;
  TORCH_ARG(bool, batch_norm) = true;
  // "after_each": pool after every conv; "after_last": one 2x2 pool at the end (the bench/ddp CNN).
  TORCH_ARG(std::string, pooling) = "after_each";
  TORCH_ARG(double, dropout) = 0.0;
};

class ConvNet : public ImageClassifier {
 public:
  explicit ConvNet(const ConvNetOptions& options = ConvNetOptions());
  torch::Tensor forward(const torch::Tensor& image) override;

 private:
  ConvNetOptions options_;
  torch::nn::Sequential features_{nullptr};
  torch::nn::Sequential head_{nullptr};
};

struct MLPOptions {
  TORCH_ARG(int64_t, in_features) = 784;
  TORCH_ARG(std::vector<int64_t>, hidden) = std::vector<int64_t>{256};
  TORCH_ARG(int64_t, num_classes) = 10;
};

class MLP : public ImageClassifier {
 public:
  explicit MLP(const MLPOptions& options = MLPOptions());
  torch::Tensor forward(const torch::Tensor& image) override;

 private:
  torch::nn::Sequential layers_{nullptr};
};

}  // namespace lockstep
