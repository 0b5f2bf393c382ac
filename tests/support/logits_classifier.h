// LogitsClassifier: the test models that classify say only how an input
// becomes logits; the loss ("loss", cross entropy against "y") and the
// prediction ("logits") are written once here, so every test model computes
// them the same way.
//
//   struct TinyMlp : lockstep::testing::LogitsClassifier {
//     TinyMlp() { fc = register_module("fc", torch::nn::Linear(6, 3)); }
//     torch::Tensor logits(const torch::Tensor& x) override { return fc(x); }
//     torch::nn::Linear fc{nullptr};
//   };
//
// Header-only, so that any test binary can use it without build changes.
#pragma once

#include <torch/torch.h>

#include "lockstep/model/model.h"

namespace lockstep::testing {

struct LogitsClassifier : Model {
  // The logits of a batch of inputs ("x").
  virtual torch::Tensor logits(const torch::Tensor& x) = 0;

  LossDict loss(const Batch& data) override {
    LossDict losses;
    losses.insert("loss", torch::nn::functional::cross_entropy(logits(data.at("x")), data.at("y")));
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"logits", logits(data.at("x"))}}; }
};

}  // namespace lockstep::testing
