#include "lockstep/optim/optimizer_builder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <unordered_set>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "lockstep/config/key_usage.h"
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

std::vector<std::function<bool(const torch::nn::Module&)>>& norm_predicates() {
  static std::vector<std::function<bool(const torch::nn::Module&)>> predicates;
  return predicates;
}

template <typename... Impls>
bool is_any_of(const torch::nn::Module& module) {
  return (... || (dynamic_cast<const Impls*>(&module) != nullptr));
}

std::string leaf_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The custom key for `name`: longest substring match, alphabetical among ties.
const CustomKeyOptions* match_custom_key(const std::string& name,
                                         const std::vector<CustomKeyOptions>& keys) {
  // mmengine matches f"{prefix}.{name}", so a root parameter reads ".name".
  const std::string subject = name.find('.') == std::string::npos ? "." + name : name;
  const CustomKeyOptions* best = nullptr;
  for (const auto& key : keys) {
    if (subject.find(key.key) == std::string::npos) continue;
    if (!best || key.key.size() > best->key.size() ||
        (key.key.size() == best->key.size() && key.key < best->key)) {
      best = &key;
    }
  }
  return best;
}

// (lr_mult, decay_mult) of one parameter under mmengine's rules.
std::pair<double, double> multipliers(const std::string& name, bool is_norm,
                                      const ParamwiseOptions& options) {
  if (const CustomKeyOptions* key = match_custom_key(name, options.custom_keys())) {
    return {key->lr_mult, key->decay_mult.value_or(1.0)};
  }
  const bool is_bias = leaf_name(name) == "bias";
  const double lr_mult = (is_bias && !is_norm) ? options.bias_lr_mult() : 1.0;
  double decay_mult = 1.0;
  if (is_norm) {
    decay_mult = options.norm_decay_mult().value_or(1.0);
  } else if (is_bias) {
    decay_mult = options.bias_decay_mult().value_or(1.0);
  }
  return {lr_mult, decay_mult};
}

// The first paramwise key that sets a decay multiplier, as (label, location);
// empty when none does.
std::pair<std::string, std::string> first_decay_key(const Config& cfg,
                                                    const ParamwiseOptions& options) {
  auto location = [&](const std::string& key) { return cfg.is_map() ? cfg.where(key) : cfg.where(); };
  if (options.bias_decay_mult()) return {"bias_decay_mult", location("bias_decay_mult")};
  if (options.norm_decay_mult()) return {"norm_decay_mult", location("norm_decay_mult")};
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

BuiltOptimizer build_from_specs(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                const ParamwiseOptions& paramwise,
                                std::vector<ParamGroupSpec> specs) {
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
  for (auto& spec : specs) {
    groups.emplace_back(spec.params);
    built.groups.push_back(spec.info);
  }
  built.optimizer = optimizer_registry().build(optimizer_cfg, std::move(groups));
  auto& optimizer = *built.optimizer;
  LOCKSTEP_CHECK(optimizer.param_groups().size() == built.groups.size(), optimizer_cfg.where(),
                 ": the optimizer factory changed the number of parameter groups");
  for (size_t g = 0; g < built.groups.size(); ++g) {
    const ParamGroupInfo& info = built.groups[g];
    if (info.lr_mult != 1.0) {
      set_group_option(optimizer, g, "lr", get_group_option(optimizer, g, "lr") * info.lr_mult);
    }
    if (info.decay_mult != 1.0) {
      set_group_option(optimizer, g, "weight_decay",
                       get_group_option(optimizer, g, "weight_decay") * info.decay_mult);
    }
  }
  return built;
}

double read_mult(const Config& cfg, const std::string& key) {
  return read(cfg, key, std::nullopt, kNonNegative);
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

ParamwiseOptions parse_paramwise_options(const Config& cfg) {
  ParamwiseOptions options;
  if (cfg.is_null()) return options;
  LOCKSTEP_CHECK(cfg.is_map(), cfg.where(), ": paramwise_cfg must be a map");
  if (cfg.has("bias_lr_mult")) options.bias_lr_mult(read_mult(cfg, "bias_lr_mult"));
  if (cfg.has("bias_decay_mult")) options.bias_decay_mult(read_mult(cfg, "bias_decay_mult"));
  if (cfg.has("norm_decay_mult")) options.norm_decay_mult(read_mult(cfg, "norm_decay_mult"));
  if (cfg.has("custom_keys")) {
    Config keys = cfg.at("custom_keys");
    LOCKSTEP_CHECK(keys.is_map(), keys.where(),
                   ": custom_keys must be a map of name substring -> {lr_mult, decay_mult}");
    for (const std::string& name : keys.keys()) {
      Config entry = keys.at(name);
      LOCKSTEP_CHECK(entry.is_map(), entry.where(), ": custom_keys.", name,
                     " must be a map with lr_mult and/or decay_mult");
      CustomKeyOptions key;
      key.key = name;
      if (entry.has("lr_mult")) key.lr_mult = read_mult(entry, "lr_mult");
      if (entry.has("decay_mult")) key.decay_mult = read_mult(entry, "decay_mult");
      options.custom_keys().push_back(key);
    }
  }
  check_all_used(cfg, "paramwise_cfg");
  return options;
}

void add_norm_module_predicate(std::function<bool(const torch::nn::Module&)> predicate) {
  norm_predicates().push_back(std::move(predicate));
}

bool is_norm_module(const torch::nn::Module& module) {
  namespace nn = torch::nn;
  if (is_any_of<nn::BatchNorm1dImpl, nn::BatchNorm2dImpl, nn::BatchNorm3dImpl,
                nn::InstanceNorm1dImpl, nn::InstanceNorm2dImpl, nn::InstanceNorm3dImpl,
                nn::GroupNormImpl, nn::LayerNormImpl>(module)) {
    return true;
  }
  for (const auto& predicate : norm_predicates()) {
    if (predicate(module)) return true;
  }
  return false;
}

std::set<std::string> norm_parameter_names(const torch::nn::Module& model) {
  std::set<std::string> names;
  // The const, named apply visits the root as "" and needs no shared_ptr.
  model.apply([&](const std::string& prefix, const torch::nn::Module& module) {
    if (!is_norm_module(module)) return;
    for (const auto& param : module.named_parameters(/*recurse=*/false)) {
      names.insert(prefix.empty() ? param.key() : prefix + "." + param.key());
    }
  });
  return names;
}

std::vector<ParamGroupSpec> build_param_groups(const torch::nn::Module& model,
                                               const ParamwiseOptions& options) {
  NamedParams named;
  for (const auto& param : model.named_parameters(/*recurse=*/true)) {
    named.emplace_back(param.key(), param.value());
  }
  return build_param_groups(named, norm_parameter_names(model), options);
}

std::vector<ParamGroupSpec> build_param_groups(const NamedParams& named_params,
                                               const std::set<std::string>& norm_param_names,
                                               const ParamwiseOptions& options) {
  std::vector<ParamGroupSpec> groups;
  std::map<std::pair<double, double>, size_t> group_of;  // (lr_mult, decay_mult) -> index
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& [name, param] : named_params) {
    LOCKSTEP_CHECK(param.defined(), "parameter '", name, "' is an undefined tensor");
    if (!param.requires_grad() || !seen.insert(param.unsafeGetTensorImpl()).second) continue;
    const auto mults = multipliers(name, norm_param_names.count(name) > 0, options);
    auto found = group_of.find(mults);
    if (found == group_of.end()) {
      found = group_of.emplace(mults, groups.size()).first;
      ParamGroupSpec spec;
      spec.info.lr_mult = mults.first;
      spec.info.decay_mult = mults.second;
      groups.push_back(std::move(spec));
    }
    groups[found->second].params.push_back(param);
    groups[found->second].info.param_names.push_back(name);
  }
  return groups;
}

BuiltOptimizer build_optimizer_with_groups(const Config& optimizer_cfg, const Config& paramwise_cfg,
                                           const NamedParams& named_params,
                                           const std::set<std::string>& norm_param_names) {
  const ParamwiseOptions paramwise = parse_paramwise_options(paramwise_cfg);
  return build_from_specs(optimizer_cfg, paramwise_cfg, paramwise,
                          build_param_groups(named_params, norm_param_names, paramwise));
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
