// Small models and a reference trainer shared by the DDP tests.
//
// Each DDP worker trains its slice of a global batch with DDP and, in the same
// process, trains an identical model on the whole batch without any
// communication: the two must end with the same parameters.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "lockstep/model/model.h"
#include "lockstep/optim/optim_wrapper.h"
#include "tests/support/logits_classifier.h"

namespace lockstep::testing {

// x -> relu(fc1) -> fc2 -> cross-entropy. `unused` never takes part in the loss.
struct DdpMlp : testing::LogitsClassifier {
  explicit DdpMlp(int64_t hidden = 64, bool with_unused = false) {
    fc1 = register_module("fc1", torch::nn::Linear(16, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 5));
    if (with_unused) unused = register_module("unused", torch::nn::Linear(hidden, 3));
  }
  torch::Tensor logits(const torch::Tensor& x) override { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr};
};

// DdpMlp plus an auxiliary head that only some samples use: a sample whose
// "aux" flag is set adds 0.5 * mean(aux(h)^2) to the loss. A batch slice
// without flagged samples leaves `aux` out of this rank's graph, so the head
// can be used on some ranks and unused on others in the same step.
struct SometimesAuxMlp : Model {
  SometimesAuxMlp() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 5));
    aux = register_module("aux", torch::nn::Linear(32, 3));
  }
  LossDict loss(const Batch& data) override {
    torch::Tensor h = torch::relu(fc1(data.at("x")));
    LossDict losses;
    losses.insert("loss", torch::nn::functional::cross_entropy(fc2(h), data.at("y")));
    torch::Tensor flags = data.at("aux");
    if (flags.any().item<bool>()) {
      torch::Tensor picked = h.index({flags});
      losses.insert("loss_aux", 0.5 * aux(picked).pow(2).mean());
    }
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"logits", fc2(torch::relu(fc1(data.at("x"))))}}; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, aux{nullptr};
};

// fc -> BatchNorm1d -> relu -> fc: with SyncBatchNorm under DDP it must match
// BatchNorm over the whole batch in one process.
struct BatchNormMlp : testing::LogitsClassifier {
  // Only the Sequential holds the BatchNorm, so convert_sync_batchnorm can replace it.
  BatchNormMlp() {
    layers = register_module("layers", torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::BatchNorm1d(32),
                                                             torch::nn::ReLU(), torch::nn::Linear(32, 5)));
  }
  torch::Tensor logits(const torch::Tensor& x) override { return layers->forward(x); }
  torch::nn::Sequential layers{nullptr};
};

// A tied autoencoder-classifier: the same weight encodes and decodes.
struct TiedModel : Model {
  TiedModel() {
    shared = register_parameter("shared", torch::randn({8, 16}) * 0.2);
    head = register_module("head", torch::nn::Linear(8, 5));
  }
  LossDict loss(const Batch& data) override {
    torch::Tensor x = data.at("x");
    torch::Tensor code = torch::tanh(x.matmul(shared.t()));
    torch::Tensor reconstruction = code.matmul(shared);
    LossDict losses;
    losses.insert("loss_cls", torch::nn::functional::cross_entropy(head(code), data.at("y")));
    losses.insert("loss_rec", torch::mse_loss(reconstruction, x));
    return losses;
  }
  Batch predict(const Batch& data) override { return {{"logits", head(torch::tanh(data.at("x").matmul(shared.t())))}}; }
  torch::Tensor shared;
  torch::nn::Linear head{nullptr};
};

inline Batch global_batch(int64_t size, uint64_t seed) {
  torch::manual_seed(seed);
  return Batch{{"x", torch::randn({size, 16})}, {"y", torch::randint(0, 5, {size}, torch::kLong)}};
}

inline std::shared_ptr<OptimWrapper> sgd_momentum(torch::nn::Module& model, int64_t accumulation = 1) {
  std::vector<torch::Tensor> params;
  for (auto& p : model.parameters()) {
    bool seen = false;
    for (auto& q : params) seen = seen || q.is_same(p);
    if (!seen) params.push_back(p);
  }
  return std::make_shared<OptimWrapper>(
      std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9)),
      OptimWrapperOptions().accumulative_counts(accumulation));
}

// Max relative difference over all parameters and buffers, for messages.
inline void expect_same_state(torch::nn::Module& a, torch::nn::Module& b, double rtol, double atol) {
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    const torch::Tensor& x = item.value();
    const torch::Tensor& y = pb[item.key()];
    EXPECT_TRUE(torch::allclose(x, y, rtol, atol))
        << item.key() << ": max |diff| " << (x - y).abs().max().item<double>();
  }
  auto ba = a.named_buffers();
  auto bb = b.named_buffers();
  for (const auto& item : ba) {
    EXPECT_TRUE(torch::allclose(item.value().to(torch::kDouble), bb[item.key()].to(torch::kDouble), rtol, atol))
        << "buffer " << item.key();
  }
}

}  // namespace lockstep::testing
