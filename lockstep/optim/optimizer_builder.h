// Optimizers built from config, over parameter groups shaped by `paramwise_cfg`.
//
// The config follows mmengine's `optim_wrapper.optimizer` and
// `optim_wrapper.paramwise_cfg` (DefaultOptimWrapperConstructor):
//
//   optimizer: {type: SGD, lr: 0.1, momentum: 0.9, weight_decay: 1.0e-4}
//   paramwise_cfg:
//     bias_lr_mult: 2.0          # lr of every bias (not of norm layers)
//     norm_decay_mult: 0.0       # weight decay of norm layers' params
//     custom_keys:               # by name substring; overrides the rules
//       backbone: {lr_mult: 0.1, decay_mult: 0.9}
//       head: {momentum: 0.95}   # any option of the optimizer
//   (every key: optim/paramwise.h)
//
//   auto optimizer = lockstep::build_optimizer(cfg.at("optimizer"), cfg.child("paramwise_cfg"), model);
//
// Parameter groups follow mmengine's rules and its one group per parameter
// (optim/paramwise.h); a custom key's optimizer options (momentum, betas, ...)
// are read as the optimizer reads its own, and one the optimizer does not
// have is an error naming the key, the group and the options it has.
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

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "lockstep/config/registry.h"
#include "lockstep/optim/param_groups.h"
#include "lockstep/optim/paramwise.h"

namespace lockstep {

// Factories receive the optimizer's config and the parameter groups (params
// only; the optimizer's defaults become every group's options). The builder
// then applies the paramwise multipliers to lr and weight_decay.
Registry<torch::optim::Optimizer, std::vector<torch::optim::OptimizerParamGroup>>&
optimizer_registry();

struct BuiltOptimizer {
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::vector<ParamGroupInfo> groups;  // parallel to optimizer->param_groups()
};

// `paramwise_cfg` may be a null Config. The named-params form sees the
// modules only through `owners` (param_owners(model)).
BuiltOptimizer build_optimizer_with_groups(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                           const NamedParams& named_params, const ParamOwners& owners = {});
BuiltOptimizer build_optimizer_with_groups(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                           const torch::nn::Module& model);

std::shared_ptr<torch::optim::Optimizer> build_optimizer(const Config& optimizer_cfg,
                                                         const Config& paramwise_cfg,
                                                         const NamedParams& named_params);
std::shared_ptr<torch::optim::Optimizer> build_optimizer(const Config& optimizer_cfg,
                                                         const Config& paramwise_cfg,
                                                         const torch::nn::Module& model);

}  // namespace lockstep
