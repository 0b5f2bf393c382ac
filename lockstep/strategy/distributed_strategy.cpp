#include "lockstep/strategy/distributed_strategy.h"

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/strategy/collectives.h"
#include "lockstep/strategy/device_choice.h"

namespace lockstep {

DistributedOptions parse_distributed_options(const Config& config) {
  DistributedOptions options;
  options.launcher(config.get<std::string>("launcher", "auto"))
      .device(config.get<std::string>("device", "auto"))
      .backend(config.get<std::string>("backend", "auto"))
      .timeout_s(config.get<double>("timeout_s", 0));
  LOCKSTEP_CHECK(options.backend() == "auto" || options.backend() == "gloo" || options.backend() == "nccl",
                 config.where("backend"), ": backend must be auto, gloo or nccl, got '", options.backend(), "'");
  // A bad device name fails here, at parse time, whatever the machine has.
  choose_device(options.device(), LocalPlace{0, 1}, 1024, config.where("device"));
  LOCKSTEP_CHECK(options.timeout_s() >= 0, config.where("timeout_s"), ": timeout_s must not be negative");
  return options;
}

DistributedStrategy::DistributedStrategy(const DistributedOptions& options) {
  // The device first: NCCL communicators, streams and allocations go to the
  // current device, so it must be this rank's before the group exists.
  const DistEnv env = is_initialized() ? dist_env() : detect_dist_env(options.launcher());
  device_ = place_on_device(options.device(), LocalPlace{env.local_rank, env.local_world_size}, "strategy.device");
  std::string backend = options.backend();
  if (backend == "auto") backend = device_.is_cuda() ? "nccl" : "gloo";
  LOCKSTEP_CHECK(backend != "nccl" || device_.is_cuda(), "strategy.backend: nccl moves CUDA tensors, but this rank's "
                 "device is ", device_.str(), " (device: ", options.device(), "); use backend gloo, or device cuda");
  if (!is_initialized()) {
    auto timeout = options.timeout_s() > 0
                       ? std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s() * 1000))
                       : default_timeout();
    init_from_env(options.launcher(), backend, timeout);
    if (!dist_env().absent_launcher.empty()) {
      logger().info("No launcher environment ('{}' sets RANK/WORLD_SIZE or their like, and none is set): "
                    "running as a world of one process", dist_env().absent_launcher);
    }
  }
  world_ = world();
  collectives_ = std::make_shared<GroupCollectives>(world_);
  logger().info("rank {} of {}: device {}, backend {}", world_->rank(), world_->size(), device_.str(), backend);
}

}  // namespace lockstep
