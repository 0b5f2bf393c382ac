// A small decoder-only transformer language model (GPT-2's layout: pre-norm
// blocks of causal self-attention and an MLP, learned positions, the output
// layer tied to the token embedding; no key bias), written as a lockstep::Model.
//
// Each Block opens lockstep::fsdp::unit_scope in its forward, so FSDP can
// shard block by block (wrap policy {type: module_type, module_types: [Block]}):
// that is all a model needs to do for FSDP. Without FSDP the scope does nothing.
// Each Block is also initialised completely by its own constructor and passed
// through lockstep::fsdp::shard_when_built, so under FSDPStrategy a rank never
// holds the whole model, not even while building it.
//
//   auto model = std::make_shared<gpt::GPT>(gpt::GPTOptions().vocab_size(96).n_layer(4));
//   auto losses = model->loss(lockstep::Batch{{"input", x}, {"target", y}});   // x, y: [B, T] token ids
//
// Used by examples/gpt (training on text), tests/fsdp and bench/fsdp.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/model/activation_checkpoint.h"
#include "lockstep/model/model.h"
#include "lockstep/parallel/fsdp/shard_while_building.h"
#include "lockstep/parallel/fsdp/unit_scope.h"

namespace gpt {

struct GPTOptions {
  TORCH_ARG(int64_t, vocab_size) = 96;
  TORCH_ARG(int64_t, block_size) = 64;  // longest context
  TORCH_ARG(int64_t, n_layer) = 4;
  TORCH_ARG(int64_t, n_head) = 4;
  TORCH_ARG(int64_t, n_embd) = 128;
  // nanoGPT's residual dropout, after attention and after the MLP.
  TORCH_ARG(double, dropout) = 0.0;

 public:
  // LoRA (Hu et al. 2021; peft's LoraConfig): with lora_rank r > 0 the
  // attention's qkv and proj layers each get a low-rank update
  // (lora_alpha / r) * B A x, A [r, in] random and B [out, r] zero (so the
  // model starts as its base), and only the adapters train: every other
  // parameter is frozen, as peft's get_peft_model leaves them.
  bool uses_lora() const { return lora_rank() > 0; }
  TORCH_ARG(int64_t, lora_rank) = 0;
  TORCH_ARG(double, lora_alpha) = 16.0;
};

// A LoRA adapter's pair: `prefix`_lora_a [rank, in] and `prefix`_lora_b
// [out, rank] registered on `owner`; (x A^T B^T) * scale is the update.
struct LoraPair {
  torch::Tensor a, b;
  double scale = 0;
  void add_to(torch::nn::Module& owner, const std::string& prefix, int64_t in, int64_t out, const GPTOptions& options) {
    if (!options.uses_lora()) return;
    a = owner.register_parameter(prefix + "_lora_a", torch::randn({options.lora_rank(), in}) / std::sqrt(static_cast<double>(in)));
    b = owner.register_parameter(prefix + "_lora_b", torch::zeros({out, options.lora_rank()}));
    scale = options.lora_alpha() / static_cast<double>(options.lora_rank());
  }
  // base(x) plus the update, or base(x) alone without adapters. As peft's
  // LoRA layer: the update is computed in the adapters' dtype and the sum
  // returned in the base's (no casts when they are the same).
  torch::Tensor apply(const torch::Tensor& x, torch::Tensor base) const {
    if (!a.defined()) return base;
    return (base + x.to(a.scalar_type()).matmul(a.t()).matmul(b.t()) * scale).to(base.scalar_type());
  }
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTOptions& options) : n_head_(options.n_head()) {
    TORCH_CHECK(options.n_embd() % options.n_head() == 0, "n_embd must be a multiple of n_head");
    const int64_t d = options.n_embd();
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(d, 3 * d).bias(false)));
    qkv_lora.add_to(*this, "qkv", d, 3 * d, options);
    // No key bias (GPT-2 has one): it adds q.b to every score of a query, which
    // softmax cancels, so its gradient is zero up to rounding, and Adam turns
    // rounding into steps of size lr. Runs that split a batch differently
    // (FSDP vs one process) would then drift apart in a parameter that does nothing.
    q_bias = register_parameter("q_bias", torch::zeros({d}));
    v_bias = register_parameter("v_bias", torch::zeros({d}));
    proj = register_module("proj", torch::nn::Linear(d, d));
    proj_lora.add_to(*this, "proj", d, d, options);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t batch = x.size(0), steps = x.size(1), channels = x.size(2);
    const int64_t head_size = channels / n_head_;
    auto parts = qkv_lora.apply(x, qkv(x)).split(channels, /*dim=*/2);
    auto heads = [&](const torch::Tensor& t) { return t.view({batch, steps, n_head_, head_size}).transpose(1, 2); };
    torch::Tensor q = heads(parts[0] + q_bias), k = heads(parts[1]), v = heads(parts[2] + v_bias);
    torch::Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_size));
    torch::Tensor future = torch::ones({steps, steps}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    torch::Tensor attention = torch::softmax(scores.masked_fill(future, -INFINITY), -1);
    torch::Tensor y = attention.matmul(v).transpose(1, 2).contiguous().view({batch, steps, channels});
    return proj_lora.apply(y, proj(y));
  }

  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor q_bias, v_bias;
  LoraPair qkv_lora, proj_lora;  // empty without lora_rank

 private:
  int64_t n_head_;
};
TORCH_MODULE(CausalSelfAttention);

// GPT-2's initialisation of `module`'s own parameters: small normal weights,
// zero biases, residual projections scaled by depth; layer norms as built.
inline void init_gpt2_weights(torch::nn::Module& module, int64_t n_layer) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor p = item.value();
    if (name.find("ln") != std::string::npos || name.find("_lora_") != std::string::npos) continue;  // as built
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      p.zero_();
    } else {
      const bool residual = name.find("proj.weight") != std::string::npos || name.find("mlp.2.weight") != std::string::npos;
      p.normal_(0.0, residual ? 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer)) : 0.02);
    }
  }
}

// With LoRA, every parameter of `module` but the adapters is frozen (the
// model key `frozen_dtype: bf16` then keeps the frozen base in bf16).
inline void train_only_adapters(torch::nn::Module& module) {
  for (auto& item : module.named_parameters()) item.value().requires_grad_(item.key().find("_lora_") != std::string::npos);
}

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTOptions& options) {
    const int64_t d = options.n_embd();
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    attn = register_module("attn", CausalSelfAttention(options));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    mlp = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(d, 4 * d), torch::nn::GELU(),
                                                       torch::nn::Linear(4 * d, d)));
    dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
    // Complete here, so that FSDP can shard the block as soon as it is built.
    init_gpt2_weights(*this, options.n_layer());
    if (options.uses_lora()) train_only_adapters(*this);
  }

  torch::Tensor forward(torch::Tensor x) {
    auto scope = lockstep::fsdp::unit_scope(*this);  // FSDP gathers this block's parameters here
    x = scope.input(x);  // its gradient ends the block's backward (frozen parameters under LoRA)
    // With `activation_checkpointing: {module_types: [Block]}` the block keeps
    // only its input, and runs again during backward.
    x = lockstep::checkpointed(*this, [this](const torch::Tensor& h) {
      torch::Tensor y = h + dropout(attn(ln1(h)));
      return y + dropout(mlp->forward(ln2(y)));
    }, x);
    return scope.output(x);
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Sequential mlp{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Block);

class GPT : public lockstep::Model {
 public:
  explicit GPT(const GPTOptions& options) : options_(options) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(options.vocab_size(), options.n_embd()));
    init_gpt2_weights(*tok_emb, options.n_layer());
    pos_emb = register_parameter("pos_emb", torch::randn({1, options.block_size(), options.n_embd()}) * 0.02);
    blocks = register_module("blocks", torch::nn::ModuleList());
    // Under FSDPStrategy each block is sharded as soon as it is built, so no
    // rank ever holds the whole model; otherwise it stays whole. The same
    // numbers either way (parallel/fsdp/shard_while_building.h).
    for (int64_t i = 0; i < options.n_layer(); ++i) blocks->push_back(lockstep::fsdp::shard_when_built(Block(options)));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.n_embd()})));
    if (options.uses_lora()) train_only_adapters(*this);
  }

  // [B, T] token ids -> [B, T, vocab] logits.
  torch::Tensor logits(const torch::Tensor& tokens) {
    const int64_t steps = tokens.size(1);
    TORCH_CHECK(steps <= options_.block_size(), "sequence of ", steps, " tokens is longer than block_size ",
                options_.block_size());
    torch::Tensor x = tok_emb(tokens) + pos_emb.narrow(1, 0, steps);
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x);
    return ln_f(x).matmul(tok_emb->weight.t());  // the output layer is the embedding, transposed
  }

  lockstep::LossDict loss(const lockstep::Batch& data) override {
    torch::Tensor out = logits(data.at("input"));
    lockstep::LossDict losses;
    // In fp32 whatever the logits' dtype (a bf16 base's are bf16), as transformers' models compute it.
    losses.insert("loss", torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}).to(torch::kFloat),
                                                               data.at("target").reshape(-1)));
    return losses;
  }

  lockstep::Batch predict(const lockstep::Batch& data) override { return {{"logits", logits(data.at("input"))}}; }

  // Continues `prompt` ([T] token ids) by `count` tokens sampled at `temperature`.
  // Under FSDP every rank must call it (units are gathered collectively) with
  // the same generator seed, so all ranks sample the same tokens.
  torch::Tensor generate(torch::Tensor prompt, int64_t count, double temperature, uint64_t seed) {
    torch::NoGradGuard no_grad;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    torch::Tensor tokens = prompt.reshape({1, -1}).to(torch::kLong);
    for (int64_t i = 0; i < count; ++i) {
      torch::Tensor context = tokens.narrow(1, std::max<int64_t>(0, tokens.size(1) - options_.block_size()),
                                            std::min(tokens.size(1), options_.block_size()));
      torch::Tensor last = logits(context.to(device())).select(1, -1).to(torch::kCPU).to(torch::kFloat);
      torch::Tensor probabilities = torch::softmax(last / temperature, -1);
      torch::Tensor next = at::multinomial(probabilities, 1, false, generator);
      tokens = torch::cat({tokens, next}, 1);
    }
    return tokens.reshape(-1);
  }

  const GPTOptions& options() const { return options_; }

  torch::nn::Embedding tok_emb{nullptr};
  torch::Tensor pos_emb;
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  GPTOptions options_;
};

}  // namespace gpt
