// Activation checkpointing: run part of a forward pass without keeping its
// activations, and run it again during backward to get them back.
//
// checkpoint(fn, inputs) is torch.utils.checkpoint's reentrant variant for
// libtorch: fn runs under no_grad, so only its inputs are kept; its outputs'
// backward runs fn again with the same random number generator state (CPU,
// and the CUDA device of the inputs), the same autocast settings, then
// backpropagates through the recomputed graph. Gradients are the ones
// without checkpointing: dropout draws the same masks both times. fn runs
// again during backward, long after the call returned: it must hold what it
// uses by value (or point at objects that outlive backward, such as the
// module itself), never at the caller's locals.
//
//   torch::Tensor forward(torch::Tensor x) {   // in a transformer block
//     return lockstep::checkpointed(*this, [this](const torch::Tensor& h) { return mlp(attn(h)); }, x);
//   }
//
// checkpointed(module, fn, x) checkpoints only when activation checkpointing
// is on for that module; apply_activation_checkpointing(model, {"Block"})
// turns it on for every module of a type, as the config key
// `activation_checkpointing: {module_types: [Block]}` does. A module whose
// forward does not go through checkpointed() cannot be checkpointed:
// unconsulted_checkpoint_modules() names the ones that were turned on but
// never asked, so that such a config fails instead of silently keeping the
// activations.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

namespace lockstep {

using CheckpointFunction = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

std::vector<torch::Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<torch::Tensor>& inputs);
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input);

// Whether `node` is the backward of a checkpointed call: the parameters it
// reaches are hidden from a walk of the graph (they appear in backward only).
bool is_checkpoint_node(const torch::autograd::Node& node);

// Turns checkpointing on for `module` (kept with a weak reference).
void enable_activation_checkpointing(const std::shared_ptr<torch::nn::Module>& module);
// Whether it is on for `module`; also records that the module asked.
bool activation_checkpointing_enabled(const torch::nn::Module& module);

// fn(input), checkpointed when it is on for `module`.
torch::Tensor checkpointed(const torch::nn::Module& module, const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                           const torch::Tensor& input);

// A module's C++ type name (torch::nn::Module::name(), namespaces included)
// matches `wanted` when equal, when it ends in "::wanted", or is wanted's
// "...Impl" (TORCH_MODULE's holder names the Impl class).
bool module_type_matches(const std::string& type_name, const std::string& wanted);

// Turns checkpointing on for every module under `root` whose type matches
// one of `type_names`; returns their paths. Throws naming the types when no
// module matches.
std::vector<std::string> apply_activation_checkpointing(torch::nn::Module& root, const std::vector<std::string>& type_names);

// The paths (under `root`) of modules with checkpointing on that never
// asked activation_checkpointing_enabled().
std::vector<std::string> unconsulted_checkpoint_modules(torch::nn::Module& root);

}  // namespace lockstep
