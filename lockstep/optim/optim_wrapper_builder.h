// Building optim wrappers from config, and the registry of their types
// ("OptimWrapper", and those of higher layers: amp/ registers its mixed
// precision wrapper and the `amp` key that selects it).
//
// A factory receives the wrapper's config section (accumulative_counts,
// clip_grad and its own keys) and the optimizer already built from it:
//
//   LOCKSTEP_REGISTER(lockstep::optim_wrapper_registry(), "MyWrapper",
//       [](const lockstep::Config& cfg, std::shared_ptr<torch::optim::Optimizer> optimizer) {
//         return std::make_shared<MyWrapper>(optimizer, lockstep::parse_optim_wrapper_options(cfg));
//       });
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "lockstep/config/registry.h"
#include "lockstep/optim/optim_wrapper.h"

namespace lockstep {

Registry<OptimWrapper, std::shared_ptr<torch::optim::Optimizer>>& optim_wrapper_registry();

// accumulative_counts and clip_grad, validated.
OptimWrapperOptions parse_optim_wrapper_options(const Config& config);

// Builds an OptimWrapper (or a dict of them) from the `optim_wrapper` section:
//   optim_wrapper:
//     type: OptimWrapper                # or a registered wrapper type
//     amp: {dtype: bf16, loss_scale: dynamic}   # a switch amp/ registers (amp/amp_optim_wrapper.h)
//     optimizer: {type: SGD, lr: 0.1, momentum: 0.9}
//     accumulative_counts: 1
//     clip_grad: {max_norm: 10, norm_type: 2}     # or {type: value, clip_value: 1}
//     paramwise_cfg: {bias_decay_mult: 0, norm_decay_mult: 0}
// A section whose entries are themselves wrappers, keyed by a child module's
// name, builds an OptimWrapperDict (one wrapper per child):
//   optim_wrapper:
//     generator: {optimizer: {type: Adam, lr: 0.0002}}
//     discriminator: {optimizer: {type: Adam, lr: 0.0002}}
std::shared_ptr<OptimWrapperBase> build_optim_wrapper(const Config& config, torch::nn::Module& model);
// Wraps an optimizer that is already built (FSDP builds it over flat shards):
// the wrapper type (`type`, or a registered switch turning OptimWrapper into
// another type) and the wrapper's own keys. The one place that decides
// which wrapper a section builds, for every strategy.
std::shared_ptr<OptimWrapper> wrap_optimizer(const Config& config, std::shared_ptr<torch::optim::Optimizer> optimizer);
// The wrapper for one set of named parameters.
std::shared_ptr<OptimWrapper> build_single_optim_wrapper(
    const Config& config, torch::nn::Module& module);
ClipGradOptions parse_clip_grad(const Config& config);

// A key of an optim_wrapper section that turns the plain OptimWrapper into
// another type: given the key's value, the type to build, or nullopt to stay
// plain (the value is then the switch's to mark used). A higher layer
// registers its own (amp/ registers `amp`), so that this layer names none:
//   register_optim_wrapper_switch("amp", [](const Config& amp) -> std::optional<std::string> { ... });
using OptimWrapperSwitch = std::function<std::optional<std::string>(const Config& value)>;
void register_optim_wrapper_switch(const std::string& key, OptimWrapperSwitch choose);

}  // namespace lockstep
