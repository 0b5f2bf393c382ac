// `paramwise_cfg`: parameter groups as mmengine's DefaultOptimWrapperConstructor
// makes them, rule for rule and in its order.
//
//   paramwise_cfg:
//     bias_lr_mult: 2.0        # lr of every bias, not of norm layers nor inside a deformable conv
//     bias_decay_mult: 0.0     # weight decay of those biases
//     norm_decay_mult: 0.0     # weight decay of BatchNorm/SyncBatchNorm/GroupNorm/LayerNorm/InstanceNorm
//     dwconv_decay_mult: 0.0   # weight decay of depthwise Conv2d (groups == in_channels)
//     flat_decay_mult: 0.0     # weight decay of any other 1-D parameter
//     dcn_offset_lr_mult: 0.1  # lr of the conv_offset Conv2d inside a DeformConv2d
//     bypass_duplicate: true   # a parameter shared by two modules is kept once (else an error)
//     custom_keys:             # by name substring; the longest key wins, then the alphabetically first
//       backbone: {lr_mult: 0.1, decay_mult: 0.9}
//       head: {momentum: 0.95}  # any option of the optimizer, for that group
//
//   ParamwiseOptions options = lockstep::parse_paramwise_options(cfg.child("paramwise_cfg"));
//   std::vector<ParamGroupSpec> groups = lockstep::build_param_groups(model, options);
//
// Note [One parameter group per parameter, as mmengine]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With a paramwise_cfg, mmengine gives every trainable parameter a group of
// its own, in the model's order (a module's own parameters, then its
// children's), and without one a single group. The groups' order is the
// order in which OptimWrapper's clip_grad hands the gradients to
// clip_grad_norm_, whose total norm sums the per-tensor norms in that order:
// merging groups of equal options, as lockstep once did, reordered that sum,
// and its last bit grew to 1.7e-3 in 20 bf16 steps (issue 59). So lockstep
// makes mmengine's groups exactly and merges none, and a saved optimizer
// state lists them as mmengine's would. The cost is a foreach step per
// group instead of per merged group: launches on a GPU, nothing a CUDA graph
// replay pays.
//
// Rules, per parameter (mmengine's add_params): frozen parameters (no
// requires_grad) are left out. A custom key matches when it is a substring of
// the parameter's dotted name; a parameter registered on the root module is
// matched as ".name", as mmengine matches f"{prefix}.{name}" with an empty
// prefix. A matched parameter gets lr * lr_mult and weight_decay * decay_mult
// (each 1 when unsaid), then every other option of the key as written (an
// `lr` or `weight_decay` there wins over the multipliers), and no other rule.
// Otherwise the bias, dcn-offset and decay rules above apply, the decay ones
// as a chain: norm, else bias, else depthwise conv, else 1-D. Every decay
// multiplier needs `weight_decay` written in the optimizer config (mmengine
// raises "base_wd should not be None"; for flat_decay_mult, where mmengine
// ignores the key, lockstep says so too).
//
// What a module is (a norm layer, a Conv2d, a depthwise one, a deformable
// conv) is asked through module_traits(): torch's own module types are known,
// and any other type (SyncBatchNorm, a scripted module's parts, a
// DeformConv2d of your own) is added with add_module_traits_reader().
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "lockstep/config/config.h"
#include "lockstep/optim/param_groups.h"

namespace lockstep {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

struct CustomKeyOptions {
  std::string key;
  double lr_mult = 1.0;
  std::optional<double> decay_mult;  // set: the key changes weight decay
  // The key's other entries (momentum, betas, eps, lr, ...), options of the
  // optimizer for this key's groups; a null Config when there are none.
  Config optimizer_options;
};

struct ParamwiseOptions {
  // Set when paramwise_cfg is a non-empty map: one group per parameter
  // (Note [One parameter group per parameter, as mmengine]).
  TORCH_ARG(bool, per_parameter_groups) = false;
  TORCH_ARG(std::optional<double>, bias_lr_mult);
  TORCH_ARG(std::optional<double>, bias_decay_mult);
  TORCH_ARG(std::optional<double>, norm_decay_mult);
  TORCH_ARG(std::optional<double>, dwconv_decay_mult);
  TORCH_ARG(std::optional<double>, flat_decay_mult);
  TORCH_ARG(std::optional<double>, dcn_offset_lr_mult);
  TORCH_ARG(bool, bypass_duplicate) = false;
  TORCH_ARG(std::vector<CustomKeyOptions>, custom_keys);
};

// Reads and validates a paramwise_cfg map (a null node gives the defaults:
// one group). Multipliers must be >= 0. Unknown keys are errors; a custom
// key's optimizer options are checked when the optimizer is built.
ParamwiseOptions parse_paramwise_options(const Config& paramwise_cfg);

// What mmengine's rules ask of the module that holds a parameter.
struct ModuleTraits {
  bool norm = false;             // a norm layer (norm_decay_mult)
  bool conv2d = false;           // a 2-D convolution (dcn_offset_lr_mult's conv_offset)
  bool depthwise_conv = false;   // a Conv2d with groups == in_channels (dwconv_decay_mult)
  bool deformable_conv = false;  // mmcv's DeformConv2d or ModulatedDeformConv2d, or one of yours
};
// A reader sets the traits it knows of a module type (and leaves the rest).
// Readers are added at static-initialisation time or before building.
using ModuleTraitsReader = std::function<void(const torch::nn::Module&, ModuleTraits&)>;
void add_module_traits_reader(ModuleTraitsReader reader);
ModuleTraits module_traits(const torch::nn::Module& module);
inline bool is_norm_module(const torch::nn::Module& module) { return module_traits(module).norm; }

// The module that holds a parameter, as the rules see it.
struct ParamOwner {
  ModuleTraits module;
  bool in_deformable_conv = false;  // the module's parent is a deformable conv
};
using ParamOwners = std::map<std::string, ParamOwner>;  // by dotted parameter name

// Every parameter of `model` (shared ones under each of their names) and its owner.
ParamOwners param_owners(const torch::nn::Module& model);

// One parameter group to hand to an optimizer.
struct ParamGroupSpec {
  std::vector<torch::Tensor> params;
  ParamGroupInfo info;
  std::string custom_key;    // the custom key that matched ("": none)
  Config optimizer_options;  // that key's optimizer options (null: none)
};

std::vector<ParamGroupSpec> build_param_groups(const torch::nn::Module& model, const ParamwiseOptions& options);
// The named-params form (FSDP's original parameters) sees the modules through
// `owners`; a name missing there is held by a plain module.
std::vector<ParamGroupSpec> build_param_groups(const NamedParams& named_params, const ParamOwners& owners,
                                               const ParamwiseOptions& options);

}  // namespace lockstep
