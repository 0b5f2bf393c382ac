#include "lockstep/optim/paramwise.h"

#include <cmath>
#include <unordered_map>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>

#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

namespace nn = torch::nn;

std::vector<ModuleTraitsReader>& readers() {
  static std::vector<ModuleTraitsReader> registered;
  return registered;
}

template <typename... Impls>
bool is_any_of(const nn::Module& module) {
  return (... || (dynamic_cast<const Impls*>(&module) != nullptr));
}

// torch's own types, as mmengine's isinstance checks see them.
void read_torch_traits(const nn::Module& module, ModuleTraits& traits) {
  if (is_any_of<nn::BatchNorm1dImpl, nn::BatchNorm2dImpl, nn::BatchNorm3dImpl, nn::InstanceNorm1dImpl,
                nn::InstanceNorm2dImpl, nn::InstanceNorm3dImpl, nn::GroupNormImpl, nn::LayerNormImpl>(module)) {
    traits.norm = true;
  }
  if (const auto* conv = dynamic_cast<const nn::Conv2dImpl*>(&module)) {
    traits.conv2d = true;
    traits.depthwise_conv = conv->options.in_channels() == conv->options.groups();
  }
}

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

void collect_owners(const nn::Module& module, const std::string& prefix, bool in_deformable_conv,
                    ParamOwners& owners) {
  const ModuleTraits traits = module_traits(module);
  for (const auto& param : module.named_parameters(/*recurse=*/false)) {
    owners[join(prefix, param.key())] = ParamOwner{traits, in_deformable_conv};
  }
  for (const auto& child : module.named_children()) {
    collect_owners(*child.value(), join(prefix, child.key()), traits.deformable_conv, owners);
  }
}

double read_mult(const Config& cfg, const std::string& key) {
  const double value = cfg.get<double>(key);
  LOCKSTEP_CHECK(std::isfinite(value) && value >= 0, cfg.where(key), ": ", key, " must be non-negative, got ", value);
  return value;
}

std::optional<double> optional_mult(const Config& cfg, const std::string& key) {
  if (!cfg.has(key)) return std::nullopt;
  return read_mult(cfg, key);
}

// The custom key for `name`: longest substring match, alphabetical among ties.
const CustomKeyOptions* match_custom_key(const std::string& name, const std::vector<CustomKeyOptions>& keys) {
  // mmengine matches f"{prefix}.{name}", so a root parameter reads ".name".
  const std::string subject = name.find('.') == std::string::npos ? "." + name : name;
  const CustomKeyOptions* best = nullptr;
  for (const auto& key : keys) {
    if (subject.find(key.key) == std::string::npos) continue;
    if (!best || key.key.size() > best->key.size() || (key.key.size() == best->key.size() && key.key < best->key)) {
      best = &key;
    }
  }
  return best;
}

// One parameter's group under mmengine's rules, in add_params' order.
ParamGroupSpec group_of(const std::string& name, const torch::Tensor& param, const ParamOwner& owner,
                        const ParamwiseOptions& options) {
  ParamGroupSpec spec;
  spec.params = {param};
  spec.info.param_names = {name};
  if (const CustomKeyOptions* key = match_custom_key(name, options.custom_keys())) {
    spec.info.lr_mult = key->lr_mult;
    spec.info.decay_mult = key->decay_mult.value_or(1.0);
    spec.custom_key = key->key;
    spec.optimizer_options = key->optimizer_options;
    return spec;
  }
  const size_t dot = name.rfind('.');
  const std::string module_name = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  const bool is_bias = leaf == "bias";
  const bool in_dcn = owner.in_deformable_conv;
  if (is_bias && !(owner.module.norm || in_dcn) && options.bias_lr_mult()) {
    spec.info.lr_mult = *options.bias_lr_mult();
  }
  if (module_name.find("conv_offset") != std::string::npos && in_dcn && options.dcn_offset_lr_mult() &&
      owner.module.conv2d) {
    spec.info.lr_mult = *options.dcn_offset_lr_mult();
  }
  if (owner.module.norm && options.norm_decay_mult()) {
    spec.info.decay_mult = *options.norm_decay_mult();
  } else if (is_bias && !in_dcn && options.bias_decay_mult()) {
    spec.info.decay_mult = *options.bias_decay_mult();
  } else if (owner.module.depthwise_conv && options.dwconv_decay_mult()) {
    spec.info.decay_mult = *options.dwconv_decay_mult();
  } else if (param.dim() == 1 && !in_dcn && options.flat_decay_mult()) {
    spec.info.decay_mult = *options.flat_decay_mult();
  }
  return spec;
}

}  // namespace

ParamwiseOptions parse_paramwise_options(const Config& cfg) {
  ParamwiseOptions options;
  if (cfg.is_null()) return options;
  LOCKSTEP_CHECK(cfg.is_map(), cfg.where(), ": paramwise_cfg must be a map");
  options.per_parameter_groups(cfg.size() > 0);
  options.bias_lr_mult(optional_mult(cfg, "bias_lr_mult"));
  options.bias_decay_mult(optional_mult(cfg, "bias_decay_mult"));
  options.norm_decay_mult(optional_mult(cfg, "norm_decay_mult"));
  options.dwconv_decay_mult(optional_mult(cfg, "dwconv_decay_mult"));
  options.flat_decay_mult(optional_mult(cfg, "flat_decay_mult"));
  options.dcn_offset_lr_mult(optional_mult(cfg, "dcn_offset_lr_mult"));
  options.bypass_duplicate(cfg.get<bool>("bypass_duplicate", false));
  if (cfg.has("custom_keys")) {
    Config keys = cfg.at("custom_keys");
    LOCKSTEP_CHECK(keys.is_map(), keys.where(),
                   ": custom_keys must be a map of name substring -> {lr_mult, decay_mult, optimizer options}");
    for (const std::string& name : keys.keys()) {
      Config entry = keys.at(name);
      LOCKSTEP_CHECK(entry.is_map(), entry.where(), ": custom_keys.", name,
                     " must be a map of lr_mult, decay_mult and options of the optimizer");
      CustomKeyOptions key;
      key.key = name;
      for (const std::string& option : entry.keys()) {
        if (option == "lr_mult") {
          key.lr_mult = read_mult(entry, "lr_mult");
        } else if (option == "decay_mult") {
          key.decay_mult = read_mult(entry, "decay_mult");
        } else {
          // Checked against the optimizer when it is built (optimizer_builder.cpp).
          if (key.optimizer_options.is_null()) key.optimizer_options = Config::map();
          key.optimizer_options.set(option, entry.at(option));
          mark_used(entry.at(option));
        }
      }
      options.custom_keys().push_back(key);
    }
  }
  check_all_used(cfg, "paramwise_cfg");
  return options;
}

void add_module_traits_reader(ModuleTraitsReader reader) { readers().push_back(std::move(reader)); }

ModuleTraits module_traits(const torch::nn::Module& module) {
  ModuleTraits traits;
  read_torch_traits(module, traits);
  for (const auto& reader : readers()) reader(module, traits);
  return traits;
}

ParamOwners param_owners(const torch::nn::Module& model) {
  ParamOwners owners;
  collect_owners(model, "", false, owners);
  return owners;
}

std::vector<ParamGroupSpec> build_param_groups(const torch::nn::Module& model, const ParamwiseOptions& options) {
  NamedParams named;
  // Every name of a shared parameter, as mmengine's add_params walks the
  // modules (libtorch's named_parameters lists each name once, in that order).
  for (const auto& param : model.named_parameters(/*recurse=*/true)) named.emplace_back(param.key(), param.value());
  return build_param_groups(named, param_owners(model), options);
}

std::vector<ParamGroupSpec> build_param_groups(const NamedParams& named_params, const ParamOwners& owners,
                                               const ParamwiseOptions& options) {
  std::vector<ParamGroupSpec> groups;
  std::unordered_map<const c10::TensorImpl*, std::string> added;  // tensor -> the name it was added under
  for (const auto& [name, param] : named_params) {
    LOCKSTEP_CHECK(param.defined(), "parameter '", name, "' is an undefined tensor");
    if (!param.requires_grad()) continue;
    auto [first, fresh] = added.emplace(param.unsafeGetTensorImpl(), name);
    if (!fresh) {
      // Without paramwise_cfg mmengine hands model.parameters() over, which
      // lists a shared parameter once; with it, a second group would hold it
      // again, which torch.optim refuses.
      LOCKSTEP_CHECK(!options.per_parameter_groups() || options.bypass_duplicate(), "paramwise_cfg: parameter '",
                     name, "' is the tensor '", first->second,
                     "' already is (one parameter shared by two modules), and a parameter can be in one group "
                     "only; set paramwise_cfg.bypass_duplicate: true to keep it once, under its first name, as "
                     "mmengine does");
      continue;
    }
    if (!options.per_parameter_groups()) {
      if (groups.empty()) groups.emplace_back();
      groups.front().params.push_back(param);
      groups.front().info.param_names.push_back(name);
      continue;
    }
    const auto owner = owners.find(name);
    groups.push_back(group_of(name, param, owner == owners.end() ? ParamOwner{} : owner->second, options));
  }
  return groups;
}

}  // namespace lockstep
