#include "lockstep/optim/optimizer_builder.h"

#include <cmath>
#include <map>
#include <tuple>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "lockstep/core/error.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/foreach_choice.h"
#include "lockstep/optim/sgd.h"

namespace lockstep {
namespace {

namespace optim = torch::optim;
using Groups = std::vector<optim::OptimizerParamGroup>;

// ---- reading optimizer options ---------------------------------------------

// A number from `cfg[key]` (or `fallback` when absent; no fallback: required)
// that must lie in [low, high] or [low, high) / (low, ...] as the flags say.
struct Bounds {
  double low;
  bool low_open;
  double high;
  bool high_open;
  const char* text;  // "positive", "in [0, 1)", ...
};
const Bounds kPositive{0, true, INFINITY, true, "positive"};
const Bounds kNonNegative{0, false, INFINITY, true, "non-negative"};
const Bounds kUnitOpen{0, false, 1, true, "in [0, 1)"};
const Bounds kUnitClosed{0, false, 1, false, "in [0, 1]"};

void check_bounds(const Config& cfg, const std::string& key, const std::string& label, double value,
                  const Bounds& bounds) {
  const bool low_ok = bounds.low_open ? value > bounds.low : value >= bounds.low;
  const bool high_ok = bounds.high_open ? value < bounds.high : value <= bounds.high;
  LOCKSTEP_CHECK(std::isfinite(value) && low_ok && high_ok, cfg.where(key), ": ", label, " must be ",
                 bounds.text, ", got ", value);
}

double read(const Config& cfg, const std::string& key, std::optional<double> fallback,
            const Bounds& bounds) {
  const double value = fallback ? cfg.get<double>(key, *fallback) : cfg.get<double>(key);
  check_bounds(cfg, key, key, value, bounds);
  return value;
}

std::tuple<double, double> read_betas(const Config& cfg) {
  std::vector<double> betas = cfg.get<std::vector<double>>("betas", {0.9, 0.999});
  LOCKSTEP_CHECK(betas.size() == 2, cfg.where("betas"), ": betas must be a list of two numbers, got ",
                 betas.size());
  for (size_t i = 0; i < 2; ++i) {
    check_bounds(cfg, "betas", str_cat("betas[", i, "]"), betas[i], kUnitOpen);
  }
  return {betas[0], betas[1]};
}

// `foreach` (PyTorch's key: null, true or false; optim/foreach_choice.h)
// and `capturable` (PyTorch's key: the step keeps its numbers on the device,
// optim/device_side_step.h). The capturable step is single-tensor, so the
// two refuse each other, naming `foreach`.
template <typename OptimizerT>
void set_step_path(OptimizerT& optimizer, const Config& cfg) {
  optimizer.set_foreach(parse_foreach(cfg));
  if (!cfg.get<bool>("capturable", false)) return;
  try {
    optimizer.set_capturable(true);
  } catch (const Error& error) {
    LOCKSTEP_FAIL(cfg.where(optimizer.foreach().value_or(false) ? "foreach" : "capturable"), ": ", error.what());
  }
}

std::shared_ptr<optim::Optimizer> make_sgd(const Config& cfg, Groups groups) {
  optim::SGDOptions options(read(cfg, "lr", std::nullopt, kPositive));
  options.momentum(read(cfg, "momentum", 0.0, kUnitOpen))
      .dampening(read(cfg, "dampening", 0.0, kUnitClosed))
      .weight_decay(read(cfg, "weight_decay", 0.0, kNonNegative))
      .nesterov(cfg.get<bool>("nesterov", false));
  LOCKSTEP_CHECK(!options.nesterov() || (options.momentum() > 0 && options.dampening() == 0),
                 cfg.where("nesterov"), ": nesterov needs momentum > 0 and dampening 0, got momentum ",
                 options.momentum(), " and dampening ", options.dampening());
  auto sgd = std::make_shared<lockstep::SGD>(std::move(groups), options);
  set_step_path(*sgd, cfg);
  return sgd;
}

// Adam and AdamW read the same keys; only AdamW's default weight decay differs.
template <typename OptimizerT, typename OptionsT>
std::shared_ptr<optim::Optimizer> make_adam_like(const Config& cfg, Groups groups,
                                                 double default_weight_decay) {
  OptionsT options(read(cfg, "lr", 1e-3, kPositive));
  options.betas(read_betas(cfg))
      .eps(read(cfg, "eps", 1e-8, kPositive))
      .weight_decay(read(cfg, "weight_decay", default_weight_decay, kNonNegative))
      .amsgrad(cfg.get<bool>("amsgrad", false));
  auto optimizer = std::make_shared<OptimizerT>(std::move(groups), options);
  set_step_path(*optimizer, cfg);
  return optimizer;
}

std::shared_ptr<optim::Optimizer> make_rmsprop(const Config& cfg, Groups groups) {
  optim::RMSpropOptions options(read(cfg, "lr", 1e-2, kPositive));
  options.alpha(read(cfg, "alpha", 0.99, kUnitClosed))
      .eps(read(cfg, "eps", 1e-8, kPositive))
      .weight_decay(read(cfg, "weight_decay", 0.0, kNonNegative))
      .momentum(read(cfg, "momentum", 0.0, kUnitOpen))
      .centered(cfg.get<bool>("centered", false));
  return std::make_shared<optim::RMSprop>(std::move(groups), options);
}

// torch.optim.Adagrad's keys and defaults (its maximize, foreach, fused and
// differentiable have no C++ counterpart, and are unknown keys here).
std::shared_ptr<optim::Optimizer> make_adagrad(const Config& cfg, Groups groups) {
  optim::AdagradOptions options(read(cfg, "lr", 1e-2, kPositive));
  options.lr_decay(read(cfg, "lr_decay", 0.0, kNonNegative))
      .weight_decay(read(cfg, "weight_decay", 0.0, kNonNegative))
      .initial_accumulator_value(read(cfg, "initial_accumulator_value", 0.0, kNonNegative))
      .eps(read(cfg, "eps", 1e-10, kPositive));
  return std::make_shared<optim::Adagrad>(std::move(groups), options);
}

// LBFGS's step(closure) evaluates the loss and its gradients several times
// (line search, up to max_iter inner iterations); lockstep's step runs one
// forward and one backward, which DDP and FSDP reduce once.
std::shared_ptr<optim::Optimizer> refuse_lbfgs(const Config& cfg, Groups) {
  LOCKSTEP_FAIL(cfg.where("type"), ": LBFGS cannot be trained by lockstep: its step needs a closure that "
                "re-evaluates the loss and gradients several times per step, and a lockstep step is one forward "
                "and one backward (DDP and FSDP reduce the gradients once per backward). Use Adam, AdamW, SGD, "
                "RMSprop or Adagrad here; for LBFGS, write your own loop calling torch::optim::LBFGS::step with "
                "a closure (on one process)");
}

// ---- parameter groups --------------------------------------------------------

// The first paramwise key that sets a decay multiplier, as (label, location);
// empty when none does.
std::pair<std::string, std::string> first_decay_key(const Config& cfg, const ParamwiseOptions& options) {
  auto location = [&](const std::string& key) { return cfg.is_map() ? cfg.where(key) : cfg.where(); };
  const std::pair<const char*, bool> keys[] = {{"bias_decay_mult", options.bias_decay_mult().has_value()},
                                               {"norm_decay_mult", options.norm_decay_mult().has_value()},
                                               {"dwconv_decay_mult", options.dwconv_decay_mult().has_value()},
                                               {"flat_decay_mult", options.flat_decay_mult().has_value()}};
  for (const auto& [key, set] : keys) {
    if (set) return {key, location(key)};
  }
  for (const auto& key : options.custom_keys()) {
    if (!key.decay_mult) continue;
    std::string where = location("custom_keys");
    if (cfg.is_map() && cfg.child("custom_keys").is_map()) {
      Config entry = cfg.at("custom_keys").child(key.key);
      if (entry.is_map()) where = entry.where("decay_mult");
    }
    return {"custom_keys." + key.key + ".decay_mult", where};
  }
  return {};
}

// Note [A custom key's optimizer options]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// mmengine copies a custom key's entries into the group's dict, and
// torch.optim reads what it knows and silently keeps the rest. lockstep
// reads them as the optimizer's own factory reads its config: the optimizer
// config with the key's entries written over it builds an optimizer of one
// group, whose options become the group's. So every option the type has is
// accepted with the factory's own checks and bounds, for built-in and
// registered types alike, and an option it lacks fails with the registry's
// "unknown key" error, which lists the keys the type reads. `foreach` and
// `capturable` choose lockstep's step for the whole optimizer, not a group.
std::unique_ptr<optim::OptimizerOptions> custom_key_options(const Config& optimizer_cfg,
                                                            const CustomKeyOptions& custom) {
  const Config& overrides = custom.optimizer_options;
  const std::string key = "paramwise_cfg.custom_keys." + custom.key;
  for (const char* whole_optimizer : {"foreach", "capturable"}) {
    LOCKSTEP_CHECK(!overrides.has(whole_optimizer), overrides.where(whole_optimizer), ": ", key, ".",
                   whole_optimizer, ": ", whole_optimizer, " is chosen for the whole optimizer in lockstep, not for "
                   "the parameter groups of one custom key; write it in the optimizer config");
  }
  Config merged = optimizer_cfg.clone();
  for (const std::string& option : overrides.keys()) merged.set(option, overrides.at(option));
  std::shared_ptr<optim::Optimizer> one_group;
  try {
    one_group = optimizer_registry().build(
        merged, Groups{optim::OptimizerParamGroup(std::vector<torch::Tensor>{torch::empty({0})})});
  } catch (const Error& error) {
    LOCKSTEP_FAIL(key, " (the options of the parameter groups this key matches): ", error.what());
  }
  return one_group->param_groups().front().options().clone();
}

BuiltOptimizer build_from_specs(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                const ParamwiseOptions& paramwise,
                                const std::vector<ParamGroupSpec>& specs) {
  LOCKSTEP_CHECK(!specs.empty(), optimizer_cfg.where(),
                 ": there are no trainable parameters to optimize (all have requires_grad false?)");
  const auto [decay_key, decay_where] = first_decay_key(paramwise_cfg, paramwise);
  if (!decay_key.empty()) {
    LOCKSTEP_CHECK(optimizer_cfg.is_map() && optimizer_cfg.has("weight_decay"), decay_where,
                   ": paramwise_cfg.", decay_key, " needs weight_decay to be set in the optimizer config (",
                   optimizer_cfg.where(), ")");
  }
  Groups groups;
  BuiltOptimizer built;
  for (const auto& spec : specs) {
    groups.emplace_back(spec.params);
    built.groups.push_back(spec.info);
  }
  built.optimizer = optimizer_registry().build(optimizer_cfg, std::move(groups));
  auto& optimizer = *built.optimizer;
  LOCKSTEP_CHECK(optimizer.param_groups().size() == built.groups.size(), optimizer_cfg.where(),
                 ": the optimizer factory changed the number of parameter groups");
  // Every key's options are checked, whether a parameter matches it or not.
  std::map<std::string, std::unique_ptr<optim::OptimizerOptions>> key_options;
  for (const auto& custom : paramwise.custom_keys()) {
    if (!custom.optimizer_options.is_null()) key_options[custom.key] = custom_key_options(optimizer_cfg, custom);
  }
  for (size_t g = 0; g < built.groups.size(); ++g) {
    const ParamGroupInfo& info = built.groups[g];
    const Config& overrides = specs[g].optimizer_options;
    if (!overrides.is_null()) optimizer.param_groups()[g].set_options(key_options.at(specs[g].custom_key)->clone());
    // mmengine sets lr and weight_decay from the multipliers, then writes
    // the key's own entries over them.
    if (info.lr_mult != 1.0 && !overrides.has("lr")) {
      set_group_option(optimizer, g, "lr", get_group_option(optimizer, g, "lr") * info.lr_mult);
    }
    if (info.decay_mult != 1.0 && !overrides.has("weight_decay")) {
      set_group_option(optimizer, g, "weight_decay",
                       get_group_option(optimizer, g, "weight_decay") * info.decay_mult);
    }
  }
  return built;
}

}  // namespace

Registry<torch::optim::Optimizer, std::vector<torch::optim::OptimizerParamGroup>>&
optimizer_registry() {
  // Built-ins are added on first use, so no static-initialisation order matters.
  static auto* registry = [] {
    auto* r = new Registry<optim::Optimizer, Groups>("optimizer");
    r->add("SGD", make_sgd);
    r->add("Adam", [](const Config& cfg, Groups groups) {
      return make_adam_like<lockstep::Adam, optim::AdamOptions>(cfg, std::move(groups), 0.0);
    });
    r->add("AdamW", [](const Config& cfg, Groups groups) {
      return make_adam_like<lockstep::AdamW, optim::AdamWOptions>(cfg, std::move(groups), 1e-2);
    });
    r->add("RMSprop", make_rmsprop);
    r->add("Adagrad", make_adagrad);
    r->add("LBFGS", refuse_lbfgs);
    return r;
  }();
  return *registry;
}

BuiltOptimizer build_optimizer_with_groups(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                           const NamedParams& named_params, const ParamOwners& owners) {
  const ParamwiseOptions paramwise = parse_paramwise_options(paramwise_cfg);
  return build_from_specs(optimizer_cfg, paramwise_cfg, paramwise, build_param_groups(named_params, owners, paramwise));
}

BuiltOptimizer build_optimizer_with_groups(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                           const torch::nn::Module& model) {
  const ParamwiseOptions paramwise = parse_paramwise_options(paramwise_cfg);
  return build_from_specs(optimizer_cfg, paramwise_cfg, paramwise,
                          build_param_groups(model, paramwise));
}

std::shared_ptr<torch::optim::Optimizer> build_optimizer(const Config& optimizer_cfg,
                                                         const Config& paramwise_cfg,
                                                         const NamedParams& named_params) {
  return build_optimizer_with_groups(optimizer_cfg, paramwise_cfg, named_params).optimizer;
}

std::shared_ptr<torch::optim::Optimizer> build_optimizer(const Config& optimizer_cfg,
                                                         const Config& paramwise_cfg,
                                                         const torch::nn::Module& model) {
  return build_optimizer_with_groups(optimizer_cfg, paramwise_cfg, model).optimizer;
}

}  // namespace lockstep
