#include "lockstep/optim/optim_wrapper_builder.h"

#include <cmath>
#include <map>

#include "lockstep/core/error.h"
#include "lockstep/optim/foreach_choice.h"
#include "lockstep/optim/optimizer_builder.h"

namespace lockstep {

Registry<OptimWrapper, std::shared_ptr<torch::optim::Optimizer>>& optim_wrapper_registry() {
  static Registry<OptimWrapper, std::shared_ptr<torch::optim::Optimizer>> registry("optim wrapper");
  return registry;
}

OptimWrapperOptions parse_optim_wrapper_options(const Config& config) {
  OptimWrapperOptions options;
  options.accumulative_counts(config.get<int64_t>("accumulative_counts", 1));
  options.clip_grad(parse_clip_grad(config.child("clip_grad")));
  check_optim_wrapper_options(options, [&](const std::string& key) {
    const std::string clip = "clip_grad.";
    return key.rfind(clip, 0) == 0 ? config.child("clip_grad").where(key.substr(clip.size())) : config.where(key);
  });
  return options;
}

LOCKSTEP_REGISTER(optim_wrapper_registry(), "OptimWrapper",
                  [](const Config& config, std::shared_ptr<torch::optim::Optimizer> optimizer) {
                    return std::make_shared<OptimWrapper>(std::move(optimizer), parse_optim_wrapper_options(config));
                  });

ClipGradOptions parse_clip_grad(const Config& config) {
  ClipGradOptions clip;
  if (config.is_null()) return clip;
  const std::string kind = config.get<std::string>("type", "norm");
  if (kind == "norm" || kind == "norm_per_parameter") {
    clip.kind = kind == "norm" ? ClipGradOptions::Kind::kNorm : ClipGradOptions::Kind::kNormPerParameter;
    clip.max_norm = config.get<double>("max_norm");
    const std::string norm_type = config.child("norm_type").is_null() ? "2" : config.at("norm_type").text();
    clip.norm_type = (norm_type == "inf" || norm_type == ".inf") ? INFINITY : config.get<double>("norm_type", 2.0);
    clip.foreach = parse_foreach(config);
  } else if (kind == "value") {
    clip.kind = ClipGradOptions::Kind::kValue;
    clip.clip_value = config.get<double>("clip_value");
  } else {
    LOCKSTEP_FAIL(config.where("type"), ": clip_grad type must be 'norm', 'norm_per_parameter' or 'value', got '",
                  kind, "'");
  }
  return clip;
}

namespace {
std::map<std::string, OptimWrapperSwitch>& optim_wrapper_switches() {
  static std::map<std::string, OptimWrapperSwitch> switches;
  return switches;
}
}  // namespace

void register_optim_wrapper_switch(const std::string& key, OptimWrapperSwitch choose) {
  LOCKSTEP_CHECK(optim_wrapper_switches().emplace(key, std::move(choose)).second,
                 "optim wrapper switch '", key, "' registered twice");
}

std::shared_ptr<OptimWrapper> wrap_optimizer(const Config& config, std::shared_ptr<torch::optim::Optimizer> optimizer) {
  std::string type = config.get<std::string>("type", "OptimWrapper");
  // A switch (`amp: {dtype: bf16}`) turns the plain wrapper into its type, so
  // that a config can add it to a base that names `type: OptimWrapper`.
  for (const auto& [key, choose] : optim_wrapper_switches()) {
    if (!config.has(key)) continue;
    const std::optional<std::string> chosen = choose(config.at(key));
    if (chosen && type == "OptimWrapper") type = *chosen;
  }
  return optim_wrapper_registry().build_as(type, config, std::move(optimizer));
}

std::shared_ptr<OptimWrapper> build_single_optim_wrapper(const Config& config, torch::nn::Module& module) {
  return wrap_optimizer(config, build_optimizer(config.at("optimizer"), config.child("paramwise_cfg"), module));
}

std::shared_ptr<OptimWrapperBase> build_optim_wrapper(const Config& config, torch::nn::Module& model) {
  LOCKSTEP_CHECK(config.is_map(), config.where(), ": optim_wrapper must be a map");
  if (config.has("optimizer")) return build_single_optim_wrapper(config, model);
  // A dict of wrappers, one per named child module.
  auto dict = std::make_shared<OptimWrapperDict>();
  auto children = model.named_children();
  for (const auto& name : config.keys()) {
    Config entry = config.at(name);
    LOCKSTEP_CHECK(entry.is_map() && entry.has("optimizer"), entry.where(),
                   ": optim_wrapper needs either an 'optimizer' key or one entry per network, each with "
                   "an 'optimizer' (e.g. generator: {optimizer: {type: Adam, lr: 0.0002}})");
    LOCKSTEP_CHECK(children.contains(name), config.where(name), ": the model has no child module named '",
                   name, "' to optimize");
    dict->add(name, build_single_optim_wrapper(entry, *children[name]));
  }
  return dict;
}

}  // namespace lockstep
