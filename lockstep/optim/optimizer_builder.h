// Optimizers built from config, over parameter groups shaped by `paramwise_cfg`.
//
// The config follows mmengine's `optim_wrapper.optimizer` and
// `optim_wrapper.paramwise_cfg` (DefaultOptimWrapperConstructor):
//
//   optimizer: {type: SGD, lr: 0.1, momentum: 0.9, weight_decay: 1.0e-4}
//   paramwise_cfg:
//     bias_lr_mult: 2.0          # lr of every bias (not of norm layers)
//     bias_decay_mult: 0.0       # weight decay of every bias (not of norm layers)
//     norm_decay_mult: 0.0       # weight decay of BatchNorm/GroupNorm/LayerNorm/InstanceNorm params
//     custom_keys:               # by name substring; overrides the three rules above
//       backbone: {lr_mult: 0.1, decay_mult: 0.9}
//
//   auto optimizer = lockstep::build_optimizer(cfg.at("optimizer"), cfg.child("paramwise_cfg"), model);
//
// Rules (mmengine's): a parameter matches a custom key when the key is a
// substring of its dotted name, except that a parameter registered directly on
// the root module is matched as ".name" (mmengine matches "prefix.name" with an
// empty prefix). The longest matching key wins; among keys of equal length the
// alphabetically first. A matched parameter gets lr * lr_mult (default 1) and
// weight_decay * decay_mult (default 1), and the bias/norm rules are skipped.
// Any decay multiplier requires `weight_decay` to be written in the optimizer
// config (mmengine raises "base_wd should not be None").
//
// Unlike mmengine, which makes one group per parameter, parameters whose
// options come out identical share a group; groups appear in the order of their
// first parameter, parameters in model order. Frozen parameters
// (requires_grad == false) are left out, and a parameter shared by two modules
// is kept once, under its first name.
//
// Built-in optimizer types: SGD {lr (required), momentum 0, dampening 0,
// weight_decay 0, nesterov false}, Adam {lr 1e-3, betas [0.9, 0.999], eps 1e-8,
// weight_decay 0, amsgrad false}, AdamW (as Adam, weight_decay 1e-2), RMSprop
// {lr 1e-2, alpha 0.99, eps 1e-8, weight_decay 0, momentum 0, centered false},
// Adagrad {lr 1e-2, lr_decay 0, weight_decay 0, initial_accumulator_value 0,
// eps 1e-10}: the keys and defaults of torch.optim's. LBFGS is refused with
// an error: its step re-evaluates the loss through a closure several times,
// and lockstep's step is one forward and one backward. Any other type, e.g.
// one of your own, is added with LOCKSTEP_REGISTER(optimizer_registry(), ...);
// checkpoints and FSDP then need its save()/load() (optim/optimizer_state.h).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "lockstep/config/registry.h"
#include "lockstep/optim/param_groups.h"

namespace lockstep {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

// Factories receive the optimizer's config and the parameter groups (params
// only; the optimizer's defaults become every group's options). The builder
// then applies the paramwise multipliers to lr and weight_decay.
Registry<torch::optim::Optimizer, std::vector<torch::optim::OptimizerParamGroup>>&
optimizer_registry();

struct CustomKeyOptions {
  std::string key;
  double lr_mult = 1.0;
  std::optional<double> decay_mult;  // set: the key changes weight decay
};

struct ParamwiseOptions {
  TORCH_ARG(double, bias_lr_mult) = 1.0;
  TORCH_ARG(std::optional<double>, bias_decay_mult);
  TORCH_ARG(std::optional<double>, norm_decay_mult);
  TORCH_ARG(std::vector<CustomKeyOptions>, custom_keys);
};

// Reads and validates a paramwise_cfg map (a null node gives the defaults).
// Multipliers must be >= 0. Unknown keys are errors.
ParamwiseOptions parse_paramwise_options(const Config& paramwise_cfg);

// One parameter group to hand to an optimizer.
struct ParamGroupSpec {
  std::vector<torch::Tensor> params;
  ParamGroupInfo info;
};

// Modules whose parameters norm_decay_mult applies to: torch's BatchNorm,
// InstanceNorm (1d/2d/3d), GroupNorm and LayerNorm, plus any type added here
// (e.g. a SyncBatchNorm) at static-initialisation time.
void add_norm_module_predicate(std::function<bool(const torch::nn::Module&)> predicate);
bool is_norm_module(const torch::nn::Module& module);

// Dotted names of the parameters owned directly by norm modules in `model`.
std::set<std::string> norm_parameter_names(const torch::nn::Module& model);

std::vector<ParamGroupSpec> build_param_groups(const torch::nn::Module& model,
                                               const ParamwiseOptions& options);
std::vector<ParamGroupSpec> build_param_groups(const NamedParams& named_params,
                                               const std::set<std::string>& norm_param_names,
                                               const ParamwiseOptions& options);

struct BuiltOptimizer {
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::vector<ParamGroupInfo> groups;  // parallel to optimizer->param_groups()
};

// `paramwise_cfg` may be a null Config. The named-params form sees norm layers
// only through `norm_param_names`.
BuiltOptimizer build_optimizer_with_groups(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                           const NamedParams& named_params,
                                           const std::set<std::string>& norm_param_names = {});
BuiltOptimizer build_optimizer_with_groups(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                           const torch::nn::Module& model);

std::shared_ptr<torch::optim::Optimizer> build_optimizer(const Config& optimizer_cfg,
                                                         const Config& paramwise_cfg,
                                                         const NamedParams& named_params);
std::shared_ptr<torch::optim::Optimizer> build_optimizer(const Config& optimizer_cfg,
                                                         const Config& paramwise_cfg,
                                                         const torch::nn::Module& model);

}  // namespace lockstep
