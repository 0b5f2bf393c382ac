#include "lockstep/strategy/distributed_strategy.h"

#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/dist/agreement.h"
#include "lockstep/dist/comm.h"
#include "lockstep/dist/init.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/strategy/device_choice.h"

namespace lockstep {
namespace {

// JSON has no NaN or infinity; they travel as strings.
nlohmann::json encode_metrics(const LogVars& values) {
  nlohmann::json encoded = nlohmann::json::object();
  for (const auto& [name, value] : values) {
    if (std::isfinite(value)) {
      encoded[name] = value;
    } else {
      encoded[name] = std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
    }
  }
  return encoded;
}

LogVars decode_metrics(const nlohmann::json& encoded) {
  LogVars values;
  for (const auto& item : encoded.items()) {
    if (item.value().is_number()) {
      values[item.key()] = item.value().get<double>();
    } else {
      const std::string text = item.value().get<std::string>();
      values[item.key()] = text == "nan" ? NAN : (text == "inf" ? INFINITY : -INFINITY);
    }
  }
  return values;
}

}  // namespace

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
  metrics_group_ = world_->side_channel("metrics");
  side_group_ = world_->view("side");
  logger().info("rank {} of {}: device {}, backend {}", world_->rank(), world_->size(), device_.str(), backend);
}

int DistributedStrategy::rank() const { return world_->rank(); }
int DistributedStrategy::world_size() const { return world_->size(); }
void DistributedStrategy::barrier() { world_->barrier(); }

MetricsGatherer DistributedStrategy::metrics_gatherer() {
  std::shared_ptr<ProcessGroup> group = metrics_group_;
  return [group](const LogVars& local) {
    std::vector<LogVars> all;
    for (const auto& encoded : all_gather_object(encode_metrics(local), group)) {
      all.push_back(decode_metrics(encoded));
    }
    return all;
  };
}

uint64_t DistributedStrategy::broadcast_seed(uint64_t seed) {
  torch::Tensor value = torch::tensor({static_cast<int64_t>(seed & 0x7fffffffffffffffull)}, torch::kLong);
  world_->broadcast(value, 0);
  return static_cast<uint64_t>(value.item<int64_t>());
}

nlohmann::json DistributedStrategy::broadcast_from_main(const nlohmann::json& value) {
  return broadcast_object(value, 0, world_);
}

bool DistributedStrategy::any_rank(bool local) { return any_rank_true(*world_, local); }

bool DistributedStrategy::same_on_every_rank(int64_t value) {
  torch::Tensor extremes = torch::tensor({value, -value}, torch::kLong);  // max and -min in one all-reduce
  world_->all_reduce(extremes, ReduceOp::kMax);
  return extremes[0].item<int64_t>() == -extremes[1].item<int64_t>();
}

std::vector<nlohmann::json> DistributedStrategy::all_gather_json(const nlohmann::json& value) {
  return all_gather_object(value, world_);
}

void DistributedStrategy::agree(const std::string& phase, const std::function<void()>& body) {
  agree_on_outcome(*world_, phase, body);
}

Strategy::TensorCollectives DistributedStrategy::tensor_collectives() {
  std::shared_ptr<ProcessGroup> group = world_;
  TensorCollectives collectives;
  collectives.average = [group](torch::Tensor& tensor) { group->all_reduce(tensor, ReduceOp::kAvg); };
  collectives.broadcast = [group](torch::Tensor& tensor) { group->broadcast(tensor, /*root=*/0); };
  return collectives;
}

std::vector<nlohmann::json> DistributedStrategy::collect_results(const std::vector<nlohmann::json>& local,
                                                                 int64_t dataset_size) {
  // Rank r evaluated samples r, r + world, r + 2 world, ... (DefaultSampler):
  // interleaving the ranks' lists restores dataset order, and cutting at the
  // dataset size drops the samples repeated to even out the shards.
  std::vector<nlohmann::json> parts = all_gather_object(nlohmann::json(local), side_group_);
  std::vector<nlohmann::json> ordered;
  size_t longest = 0;
  for (const auto& part : parts) longest = std::max(longest, part.size());
  for (size_t i = 0; i < longest && static_cast<int64_t>(ordered.size()) < dataset_size; ++i) {
    for (const auto& part : parts) {
      if (i < part.size() && static_cast<int64_t>(ordered.size()) < dataset_size) ordered.push_back(part[i]);
    }
  }
  return ordered;
}

}  // namespace lockstep
