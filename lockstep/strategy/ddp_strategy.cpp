#include "lockstep/strategy/ddp_strategy.h"

#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"
#include "lockstep/model/model.h"
#include "lockstep/parallel/sync_batchnorm.h"

namespace lockstep {

DDPStrategyOptions parse_ddp_strategy_options(const Config& config) {
  DDPStrategyOptions options;
  options.distributed = parse_distributed_options(config);
  options.sync_bn = config.get<std::string>("sync_bn", "");
  LOCKSTEP_CHECK(options.sync_bn.empty() || options.sync_bn == "torch", config.where("sync_bn"),
                 ": sync_bn must be 'torch' (convert BatchNorm to SyncBatchNorm) or absent, got '", options.sync_bn, "'");
  Config wrapper = config.child("model_wrapper");
  if (!wrapper.is_null()) {
    const std::string type = wrapper.get<std::string>("type", "MMDistributedDataParallel");
    if (type == "MMSeparateDistributedDataParallel" || type == "SeparateDistributedDataParallel") {
      options.separate = true;
    } else {
      LOCKSTEP_CHECK(type == "MMDistributedDataParallel" || type == "DistributedDataParallel", wrapper.where("type"),
                     ": unknown model wrapper '", type, "'; DDPStrategy knows MMDistributedDataParallel, "
                     "DistributedDataParallel, MMSeparateDistributedDataParallel, SeparateDistributedDataParallel");
    }
    options.ddp = parse_ddp_options(wrapper, options.ddp);
    if (wrapper.has("comm_hook")) {
      options.comm_hook = wrapper.at("comm_hook");
      make_comm_hook(options.comm_hook);  // a bad name or option fails here, before any process group exists
    }
    check_all_used(wrapper, "model_wrapper");
  }
  return options;
}

DDPStrategy::DDPStrategy(DDPStrategyOptions options)
    : DistributedStrategy(options.distributed), options_(std::move(options)) {}

void DDPStrategy::place_model(Model& model) {
  model.move_to(device_);
  if (options_.sync_bn == "torch") {
    LOCKSTEP_CHECK(model.submodules_run_in_cpp(),
                   "strategy.sync_bn: a TorchScriptModel's BatchNorm layers run inside TorchScript and cannot be "
                   "converted to SyncBatchNorm from C++; convert them in Python before scripting "
                   "(torch.nn.SyncBatchNorm.convert_sync_batchnorm does not script either), or drop sync_bn and "
                   "keep per-rank BatchNorm statistics");
    // The model object is the root, so its children are replaced in place.
    convert_sync_batchnorm(model.shared_from_this(), world_);
  }
  if (options_.separate) {
    separate_ = std::make_shared<SeparateDistributedDataParallel>(model.shared_from_this(), world_, options_.ddp);
    // One hook per network: each keeps its own state.
    if (!options_.comm_hook.is_null()) {
      for (auto& [name, child] : separate_->children()) child->register_comm_hook(make_comm_hook(options_.comm_hook));
    }
  } else {
    ddp_ = std::make_shared<DistributedDataParallel>(model.shared_from_this(), world_, options_.ddp);
    if (!options_.comm_hook.is_null()) ddp_->register_comm_hook(make_comm_hook(options_.comm_hook));
  }
}

std::shared_ptr<OptimWrapperBase> DDPStrategy::build_optim_wrapper_for(const Config& config, Model& model) {
  std::shared_ptr<OptimWrapperBase> optim_wrapper = Strategy::build_optim_wrapper_for(config, model);
  if (separate_) {
    separate_->attach(*optim_wrapper);
    return optim_wrapper;
  }
  auto wrappers = optim_wrapper->wrappers();
  LOCKSTEP_CHECK(wrappers.size() == 1, "DDPStrategy: the model has ", wrappers.size(),
                 " optim wrappers; a model with several optimizers needs model_wrapper: "
                 "{type: MMSeparateDistributedDataParallel} so each network synchronises on its own");
  wrappers.front().second->set_gradient_sync(ddp_);
  return optim_wrapper;
}

LOCKSTEP_REGISTER(strategy_registry(), "DDPStrategy",
                  [](const Config& config) { return std::make_shared<DDPStrategy>(parse_ddp_strategy_options(config)); });

std::string DDPStrategy::cuda_graph_obstacle() const {
  std::string obstacle = Strategy::cuda_graph_obstacle();
  if (!obstacle.empty()) return obstacle;
  if (options_.ddp.find_unused_parameters()) {
    return "find_unused_parameters: which parameters took part is found on the host after each forward, and a "
           "replayed step would reuse the first step's answer";
  }
  return "DDPStrategy's step is not captured yet: its gradient buckets are reduced and the ranks' iterations "
         "checked by host code a replay would skip (train with SingleDeviceStrategy, or without cuda_graph)";
}

}  // namespace lockstep
