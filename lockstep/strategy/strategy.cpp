#include "lockstep/strategy/strategy.h"

#include <set>
#include <sstream>

#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/shape_text.h"
#include "lockstep/model/model.h"
#include "lockstep/optim/optim_wrapper_builder.h"
#include "lockstep/strategy/device_choice.h"

namespace lockstep {
Strategy::~Strategy() = default;

void Strategy::prepare(std::shared_ptr<Model> model, const Config& optim_wrapper_config, const Config& scheduler_config,
                       const SchedulerContext& context) {
  LOCKSTEP_CHECK(model != nullptr, name(), ".prepare needs a model");
  model_ = std::move(model);
  place_model(*model_);
  if (optim_wrapper_config.is_null()) return;  // evaluation only
  optim_wrapper_ = build_optim_wrapper_for(optim_wrapper_config, *model_);
  if (scheduler_config.is_null()) return;
  auto build_list = [&](const Config& list, OptimWrapper& wrapper) {
    std::vector<std::shared_ptr<ParamScheduler>> built;
    // Schedulers of one optimizer share its recorded initial values; another
    // optimizer starts from its own.
    SchedulerContext per_optimizer = context;
    per_optimizer.initial_values = std::make_shared<InitialValues>();
    Config entries = list;
    if (list.is_map()) {
      entries = Config::sequence();
      entries.push_back(list);
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      built.push_back(scheduler_registry().build(entries.at(i), wrapper.optimizer(), per_optimizer));
    }
    return built;
  };
  auto wrappers = optim_wrapper_->wrappers();
  const bool per_wrapper = scheduler_config.is_map() && !scheduler_config.has("type");
  for (auto& [wrapper_name, wrapper] : wrappers) {
    if (per_wrapper) {
      Config entry = scheduler_config.child(wrapper_name);
      if (!entry.is_null()) schedulers_[wrapper_name] = build_list(entry, *wrapper);
    } else {
      schedulers_[wrapper_name] = build_list(scheduler_config, *wrapper);
    }
  }
  if (per_wrapper) {
    for (const auto& key : scheduler_config.keys()) {
      LOCKSTEP_CHECK(schedulers_.count(key) > 0, scheduler_config.where(key), ": no optim wrapper named '", key,
                     "' to schedule");
    }
  }
}

std::shared_ptr<OptimWrapperBase> Strategy::build_optim_wrapper_for(const Config& config, Model& model) {
  return build_optim_wrapper(config, model);
}

std::map<std::string, torch::Tensor> Strategy::model_state_dict() {
  LOCKSTEP_CHECK(model_ != nullptr, name(), ": no model prepared");
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : model_->named_parameters()) weights[item.key()] = item.value().detach().to(torch::kCPU).clone();
  for (const auto& item : model_->named_buffers()) weights[item.key()] = item.value().detach().to(torch::kCPU).clone();
  return weights;
}

std::map<std::string, torch::Tensor> without_module_prefix(const std::map<std::string, torch::Tensor>& weights) {
  std::map<std::string, torch::Tensor> stripped;
  for (const auto& [key, value] : weights) stripped[key.rfind("module.", 0) == 0 ? key.substr(7) : key] = value;
  return stripped;
}

LoadReport Strategy::load_model_state_dict(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                           const std::string& source) {
  LOCKSTEP_CHECK(model_ != nullptr, name(), ": no model prepared");
  const std::map<std::string, torch::Tensor> incoming = without_module_prefix(weights);
  LoadReport report;
  std::set<std::string> seen;
  auto load_into = [&](const std::string& key, torch::Tensor target) {
    seen.insert(key);
    auto found = incoming.find(key);
    if (found == incoming.end()) {
      report.missing.push_back(key);
      return;
    }
    if (found->second.sizes() != target.sizes()) {
      report.mismatched.push_back(key + ": " + source + " has " + shape_text(found->second) + ", the model has " +
                                  shape_text(target));
      return;
    }
    torch::NoGradGuard no_grad;
    target.copy_(found->second);
  };
  for (auto& item : model_->named_parameters()) load_into(item.key(), item.value());
  for (auto& item : model_->named_buffers()) load_into(item.key(), item.value());
  for (const auto& entry : incoming) {
    if (seen.count(entry.first) == 0) report.unexpected.push_back(entry.first);
  }
  if (!report.clean()) {
    LOCKSTEP_CHECK(!strict, "cannot load the model weights from ", source, " (is it a checkpoint of another model?):\n",
                   report.describe(source));
    logger().warn("{}", report.describe(source));
  }
  return report;
}

void Strategy::fill_checkpoint(CheckpointContents& contents, const CheckpointOptions& options) {
  contents.model = model_state_dict();
  if (optim_wrapper_ && options.save_optimizer()) contents.optim_wrapper = optim_wrapper_->state();
  fill_scheduler_states(contents, options);
}

void Strategy::fill_scheduler_states(CheckpointContents& contents, const CheckpointOptions& options) const {
  if (!options.save_param_scheduler()) return;
  for (const auto& [wrapper_name, list] : schedulers_) {
    auto& states = contents.param_schedulers[wrapper_name];
    for (const auto& scheduler : list) states.push_back(scheduler->state());
  }
}

void Strategy::save_checkpoint(const std::string& path, CheckpointContents contents, const CheckpointOptions& options) {
  fill_checkpoint(contents, options);
  // Rank 0 writes; every rank learns whether it could (Note [Failing together]).
  collectives_->agree("saving checkpoint " + path, [&] {
    if (collectives_->is_main_process()) write_checkpoint(path, contents);
  });
}

void Strategy::save_checkpoint_then(const std::string& path, CheckpointContents contents,
                                    const CheckpointOptions& options, std::function<void()> committed) {
  save_checkpoint(path, std::move(contents), options);
  collectives_->agree("saving checkpoint " + path + ": after it is whole", [&] {
    if (collectives_->is_main_process()) committed();
  });
}

void Strategy::after_checkpoint_saves(std::function<void()> action) {
  if (collectives_->is_main_process()) action();
}

void Strategy::replay_schedulers(int64_t iteration) {
  for (auto& [wrapper_name, list] : schedulers_) lockstep::replay_schedulers(list, iteration);
}

void Strategy::load_optim_and_schedulers(const CheckpointContents& contents, bool load_optimizer, bool load_schedulers,
                                         const std::string& path) {
  if (load_optimizer && optim_wrapper_) {
    LOCKSTEP_CHECK(contents.optim_wrapper.has_value(), path,
                   ": holds no optimizer state (saved with save_optimizer: false?)");
    try {
      optim_wrapper_->load_state(*contents.optim_wrapper);
    } catch (...) {
      rethrow_with_context(path + ": loading the optimizer state");
    }
  }
  if (load_schedulers && !schedulers_.empty() && contents.meta && contents.meta->world_size != collectives_->world_size()) {
    logger().info("{}: written by {} processes, so its scheduler states count iterations of another length; the "
                  "schedulers are replayed to the iteration training resumes at instead", path,
                  contents.meta->world_size);
    load_schedulers = false;
  }
  if (load_schedulers && !schedulers_.empty()) {
    LOCKSTEP_CHECK(!contents.param_schedulers.empty(), path, ": holds no parameter scheduler state");
    for (auto& [wrapper_name, list] : schedulers_) {
      auto found = contents.param_schedulers.find(wrapper_name);
      const size_t saved = found == contents.param_schedulers.end() ? 0 : found->second.size();
      for (size_t i = 0; i < list.size(); ++i) {
        LOCKSTEP_CHECK(i < saved, path, ": holds no state for parameter scheduler ", i,
                       wrapper_name.empty() ? "" : " of '" + wrapper_name + "'",
                       " (the config has more schedulers than the run that saved it)");
        list[i]->load_state(found->second[i]);
      }
    }
  }
}

CheckpointContents Strategy::load_checkpoint(const std::string& path, bool load_optimizer, bool load_schedulers,
                                             bool strict) {
  if (is_dcp_checkpoint(path)) return load_foreign_dcp(path, load_optimizer);
  CheckpointContents contents = read_checkpoint(path);
  if (is_dcp_manifest(contents)) return load_dcp_checkpoint(path, std::move(contents), load_optimizer, load_schedulers);
  return load_checkpoint_contents(path, std::move(contents), load_optimizer, load_schedulers, strict);
}

CheckpointContents Strategy::load_checkpoint_contents(const std::string& path, CheckpointContents contents,
                                                      bool load_optimizer, bool load_schedulers, bool strict) {
  load_model_state_dict(model_weights(contents, path), strict, path);
  load_optim_and_schedulers(contents, load_optimizer, load_schedulers, path);
  return contents;
}

void Strategy::load_sharded_weights(const std::string& path, bool /*strict*/) {
  LOCKSTEP_FAIL(path, ": a sharded FSDP checkpoint loads only into FSDPStrategy (this run uses ", name(),
                "); save it with state_dict_type: full to load it anywhere");
}

std::shared_ptr<Model> Strategy::build_model(const Config& config) { return lockstep::build_model(config); }

SingleDeviceStrategy::SingleDeviceStrategy(torch::Device device) { device_ = device; }

void SingleDeviceStrategy::place_model(Model& model) { model.move_to(device_); }

Registry<Strategy>& strategy_registry() {
  static Registry<Strategy> registry("strategy");
  return registry;
}

std::shared_ptr<Strategy> build_strategy(const Config& config) {
  if (config.is_null()) return std::make_shared<SingleDeviceStrategy>(place_on_device("auto", LocalPlace(), "strategy.device"));
  return strategy_registry().build(config);
}

LOCKSTEP_REGISTER(strategy_registry(), "SingleDeviceStrategy", [](const Config& config) {
  return std::make_shared<SingleDeviceStrategy>(
      place_on_device(config.get<std::string>("device", "auto"), LocalPlace(), config.where("device")));
});

std::string Strategy::cuda_graph_obstacle() const {
  if (device().is_cuda()) return "";
  return str_cat(name(), " trains on ", device().str(),
                 ", and only a GPU's work can be captured as a CUDA graph (strategy.device: cuda, or auto on a "
                 "machine with a GPU per local rank)");
}

}  // namespace lockstep
