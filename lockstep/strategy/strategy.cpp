#include "lockstep/strategy/strategy.h"

#include <set>
#include <sstream>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/model/model.h"
#include "lockstep/optim/optim_wrapper_builder.h"

namespace lockstep {
namespace {

std::string shape_text(const torch::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.sizes();
  return text.str();
}

// "conv1.weight, conv1.bias, fc.weight" -> "conv1.{bias, weight}, fc.weight"
std::string group_by_prefix(std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());
  std::map<std::string, std::vector<std::string>> groups;
  std::vector<std::string> order;
  for (const auto& key : keys) {
    auto dot = key.rfind('.');
    std::string prefix = dot == std::string::npos ? "" : key.substr(0, dot);
    std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
    if (groups.count(prefix) == 0) order.push_back(prefix);
    groups[prefix].push_back(leaf);
  }
  std::string text;
  for (const auto& prefix : order) {
    const auto& leaves = groups[prefix];
    text += "\n  ";
    if (prefix.empty()) {
      for (size_t i = 0; i < leaves.size(); ++i) text += (i ? ", " : "") + leaves[i];
    } else if (leaves.size() == 1) {
      text += prefix + "." + leaves[0];
    } else {
      text += prefix + ".{";
      for (size_t i = 0; i < leaves.size(); ++i) text += (i ? ", " : "") + leaves[i];
      text += "}";
    }
  }
  return text;
}

}  // namespace

std::string LoadReport::describe(const std::string& source) const {
  std::string text;
  if (!mismatched.empty()) {
    text += "Skipped loading parameters of " + source + " whose shape differs:";
    for (const auto& entry : mismatched) text += "\n  " + entry;
    text += "\n";
  }
  if (!missing.empty()) text += "Some model parameters or buffers are not in " + source + ":" + group_by_prefix(missing) + "\n";
  if (!unexpected.empty()) text += source + " holds keys the model does not use:" + group_by_prefix(unexpected) + "\n";
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

Strategy::~Strategy() = default;

void Strategy::prepare(std::shared_ptr<Model> model, const Config& optim_wrapper_config, const Config& scheduler_config,
                       const SchedulerContext& context) {
  LOCKSTEP_CHECK(model != nullptr, name(), ".prepare needs a model");
  model_ = std::move(model);
  place_model(*model_);
  if (optim_wrapper_config.is_null()) return;  // evaluation only
  optim_wrapper_ = build_optim_wrapper_for(optim_wrapper_config, *model_);
  attach_optim_wrapper(*optim_wrapper_);
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

MetricsGatherer Strategy::metrics_gatherer() {
  return [](const LogVars& local) { return std::vector<LogVars>{local}; };
}

std::vector<nlohmann::json> Strategy::collect_results(const std::vector<nlohmann::json>& local, int64_t dataset_size) {
  std::vector<nlohmann::json> results = local;
  if (static_cast<int64_t>(results.size()) > dataset_size) results.resize(static_cast<size_t>(dataset_size));
  return results;
}

std::map<std::string, torch::Tensor> Strategy::model_state_dict() {
  LOCKSTEP_CHECK(model_ != nullptr, name(), ": no model prepared");
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : model_->named_parameters()) weights[item.key()] = item.value().detach().to(torch::kCPU).clone();
  for (const auto& item : model_->named_buffers()) weights[item.key()] = item.value().detach().to(torch::kCPU).clone();
  return weights;
}

LoadReport Strategy::load_model_state_dict(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                           const std::string& source) {
  LOCKSTEP_CHECK(model_ != nullptr, name(), ": no model prepared");
  // Checkpoints written by a wrapped Python model carry a "module." prefix.
  std::map<std::string, torch::Tensor> incoming;
  for (const auto& entry : weights) {
    std::string key = entry.first;
    if (key.rfind("module.", 0) == 0) key = key.substr(7);
    incoming[key] = entry.second;
  }
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

State Strategy::checkpoint_state(State extra, const CheckpointOptions& options) {
  State state = std::move(extra);
  State model_state;
  model_state.tensors = model_state_dict();
  state.put("model", std::move(model_state));
  if (optim_wrapper_ && options.save_optimizer()) state.put("optim_wrapper", optim_wrapper_->state());
  if (options.save_param_scheduler() && !schedulers_.empty()) {
    State all;
    for (const auto& [wrapper_name, list] : schedulers_) {
      State per_wrapper;
      for (size_t i = 0; i < list.size(); ++i) per_wrapper.put(std::to_string(i), list[i]->state());
      all.put(wrapper_name.empty() ? "main" : wrapper_name, std::move(per_wrapper));
    }
    state.put("param_schedulers", std::move(all));
  }
  return state;
}

void Strategy::save_checkpoint(const std::string& path, State extra, const CheckpointOptions& options) {
  State state = checkpoint_state(std::move(extra), options);
  if (is_main_process()) write_checkpoint_file(path, state);
}

void Strategy::load_optim_and_schedulers(const State& state, bool load_optimizer, bool load_schedulers,
                                         const std::string& path) {
  if (load_optimizer && optim_wrapper_) {
    LOCKSTEP_CHECK(state.contains("optim_wrapper"), path, ": holds no optimizer state (saved with save_optimizer: false?)");
    try {
      optim_wrapper_->load_state(state.get("optim_wrapper"));
    } catch (...) {
      rethrow_with_context(path + ": loading the optimizer state");
    }
  }
  if (load_schedulers && !schedulers_.empty()) {
    LOCKSTEP_CHECK(state.contains("param_schedulers"), path, ": holds no parameter scheduler state");
    State all = state.get("param_schedulers");
    for (auto& [wrapper_name, list] : schedulers_) {
      State per_wrapper = all.get(wrapper_name.empty() ? "main" : wrapper_name);
      for (size_t i = 0; i < list.size(); ++i) {
        LOCKSTEP_CHECK(per_wrapper.contains(std::to_string(i)), path, ": holds no state for parameter scheduler ", i,
                       wrapper_name.empty() ? "" : " of '" + wrapper_name + "'",
                       " (the config has more schedulers than the run that saved it)");
        list[i]->load_state(per_wrapper.get(std::to_string(i)));
      }
    }
  }
}

State Strategy::load_checkpoint(const std::string& path, bool load_optimizer, bool load_schedulers, bool strict) {
  State state = read_checkpoint_file(path);
  load_model_state_dict(state.get("model").tensors, strict, path);
  load_optim_and_schedulers(state, load_optimizer, load_schedulers, path);
  return state;
}

SingleDeviceStrategy::SingleDeviceStrategy(torch::Device device) { device_ = device; }

void SingleDeviceStrategy::place_model(Model& model) { model.move_to(device_); }

torch::Device parse_device(const std::string& text, const std::string& where) {
  if (text == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  try {
    torch::Device device(text);
    if (device.is_cuda()) {
      LOCKSTEP_CHECK(torch::cuda::is_available(), where, ": device '", text,
                     "' asked for, but this libtorch has no CUDA or no GPU is visible");
    }
    return device;
  } catch (const Error&) {
    throw;
  } catch (...) {
    LOCKSTEP_FAIL(where, ": '", text, "' is not a device (use cpu, cuda, cuda:N or auto)");
  }
}

Registry<Strategy>& strategy_registry() {
  static Registry<Strategy> registry("strategy");
  return registry;
}

std::shared_ptr<Strategy> build_strategy(const Config& config) {
  if (config.is_null()) return std::make_shared<SingleDeviceStrategy>(torch::kCPU);
  return strategy_registry().build(config);
}

LOCKSTEP_REGISTER(strategy_registry(), "SingleDeviceStrategy", [](const Config& config) {
  return std::make_shared<SingleDeviceStrategy>(
      parse_device(config.get<std::string>("device", "cpu"), config.where("device")));
});

}  // namespace lockstep
