// Models, batches and the one-process reference shared by the FSDP tests.
//
// An FSDP worker trains its slice of a global batch and compares with an
// identical model trained on the whole batch without FSDP (rank 0 computes
// it, in the same process): after the same steps both must hold the same
// parameters.
//
// Adam runs with eps 1e-4 (and lr 3e-3): its update lr * m / (sqrt(v) + eps)
// is then smooth in the gradient at the scale where rounding lives. With the
// default eps 1e-8, a gradient element that lands within rounding of zero
// (one in ~10^4 per step for these models) takes a step anywhere in
// [-lr, lr], so two runs that merely sum in different orders -- one process
// vs FSDP, or float32 vs float64 in one process -- part by up to 1e-4 after
// 10 steps, far beyond rtol 1e-5. Measured: with these settings one process
// in float32 stays within 0.11 of the tolerance of float64 on both models
// (6 seeds, batch split 2 and 4 ways), while parameters move by ~3e-2.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "examples/gpt/gpt_model.h"
#include "lockstep/model/model.h"
#include "lockstep/optim/optim_wrapper.h"
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"
#include "tests/support/logits_classifier.h"

namespace lockstep::testing {

constexpr double kAdamLr = 3e-3;
constexpr double kAdamEps = 1e-4;
constexpr int64_t kPerRank = 3;  // samples per rank and micro-step

inline std::string env_or(const char* name, const std::string& fallback = "") {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

// x -> Sequential(Linear 16x24, Tanh, Linear 24x24, Tanh, Linear 24x5) * gain -> cross-entropy.
// The Linears are units (intercepted as Sequential entries); the root holds `gain`.
// 24x5 + 5 = 125 elements: not a multiple of 2 or 4, so shards are padded.
struct FsdpMlp : testing::LogitsClassifier {
  FsdpMlp() {
    layers = register_module("layers", torch::nn::Sequential(torch::nn::Linear(16, 24), torch::nn::Tanh(),
                                                             torch::nn::Linear(24, 24), torch::nn::Tanh(),
                                                             torch::nn::Linear(24, 5)));
    gain = register_parameter("gain", torch::ones({5}));
  }
  torch::Tensor logits(const torch::Tensor& x) override { return layers->forward(x) * gain; }
  torch::nn::Sequential layers{nullptr};
  torch::Tensor gain;
};

// Three Blocks (units through unit_scope); the root holds the tied embedding,
// the positions and the final LayerNorm.
inline gpt::GPTOptions tiny_gpt_options() {
  return gpt::GPTOptions().vocab_size(13).block_size(8).n_layer(3).n_head(2).n_embd(16);
}

inline std::shared_ptr<Model> make_model(const std::string& kind, uint64_t seed = 7) {
  torch::manual_seed(seed);
  if (kind == "mlp") return std::make_shared<FsdpMlp>();
  if (kind == "gpt") return std::make_shared<gpt::GPT>(tiny_gpt_options());
  ADD_FAILURE() << "unknown model " << kind;
  return nullptr;
}

inline std::shared_ptr<WrapPolicy> policy_for(const std::string& kind) {
  return module_type_wrap_policy({kind == "mlp" ? "Linear" : "Block"});
}

// The same batch on every rank for the same seed.
inline Batch global_batch(const std::string& kind, int64_t size, uint64_t seed) {
  torch::manual_seed(seed);
  if (kind == "mlp") return Batch{{"x", torch::randn({size, 16})}, {"y", torch::randint(0, 5, {size}, torch::kLong)}};
  torch::Tensor tokens = torch::randint(0, 13, {size, 9}, torch::kLong);
  return Batch{{"input", tokens.narrow(1, 0, 8).contiguous()}, {"target", tokens.narrow(1, 1, 8).contiguous()}};
}

inline std::shared_ptr<OptimWrapper> adam(std::vector<torch::Tensor> params, int64_t accumulation = 1,
                                          double max_norm = 0) {
  OptimWrapperOptions options;
  options.accumulative_counts(accumulation);
  if (max_norm > 0) {
    ClipGradOptions clip;
    clip.kind = ClipGradOptions::Kind::kNorm;
    clip.max_norm = max_norm;
    options.clip_grad(clip);
  }
  return std::make_shared<OptimWrapper>(
      std::make_shared<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(kAdamLr).eps(kAdamEps)),
      options);
}

// What an optimizer over `fsdp` steps: the original parameters' parts of
// the shards with use_orig_params (FullyShard sets it), else the flat shards.
inline std::vector<torch::Tensor> fsdp_optimizer_parameters(const FullyShardedDataParallel& fsdp) {
  if (!fsdp.options().use_orig_params()) return fsdp.shard_parameters();
  std::vector<torch::Tensor> params;
  for (const auto& [name, param] : fsdp.named_orig_parameters()) params.push_back(param);
  return params;
}

// The optim_wrapper config that builds the same optimizer.
inline std::string adam_config() {
  return "optimizer: {type: Adam, lr: " + std::to_string(kAdamLr) + ", eps: " + std::to_string(kAdamEps) + "}";
}

// The model's unique parameters, in model order.
inline std::vector<torch::Tensor> unique_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> params;
  for (auto& p : module.parameters()) {
    bool seen = false;
    for (auto& q : params) seen = seen || q.is_same(p);
    if (!seen) params.push_back(p);
  }
  return params;
}

inline std::map<std::string, torch::Tensor> parameters_of(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : module.named_parameters()) weights[item.key()] = item.value().detach().clone();
  return weights;
}

// Every parameter of `expected` against `actual` (allclose, or bitwise with rtol = atol = 0).
inline void expect_matches(const std::map<std::string, torch::Tensor>& actual,
                           const std::map<std::string, torch::Tensor>& expected, double rtol, double atol,
                           const std::string& what) {
  ASSERT_FALSE(expected.empty()) << what;
  for (const auto& [name, y] : expected) {
    auto found = actual.find(name);
    ASSERT_NE(found, actual.end()) << what << ": no " << name;
    const torch::Tensor& x = found->second;
    ASSERT_EQ(x.sizes(), y.sizes()) << what << ": " << name;
    const bool same = rtol == 0 && atol == 0 ? torch::equal(x, y) : torch::allclose(x, y, rtol, atol);
    EXPECT_TRUE(same) << what << ": " << name << " max |diff| " << (x - y).abs().max().item<double>();
  }
}

}  // namespace lockstep::testing
