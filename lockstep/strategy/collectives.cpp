#include "lockstep/strategy/collectives.h"

#include <algorithm>
#include <cmath>

#include "lockstep/comm/agreement.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/process_group.h"

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

Collectives::~Collectives() = default;

MetricsGatherer Collectives::metrics_gatherer() {
  return [](const LogVars& local) { return std::vector<LogVars>{local}; };
}

std::vector<nlohmann::json> Collectives::collect_results(const std::vector<nlohmann::json>& local,
                                                         int64_t dataset_size) {
  std::vector<nlohmann::json> results = local;
  if (static_cast<int64_t>(results.size()) > dataset_size) results.resize(static_cast<size_t>(dataset_size));
  return results;
}

GroupCollectives::GroupCollectives(std::shared_ptr<ProcessGroup> world)
    : world_(std::move(world)),
      metrics_group_(world_->side_channel("metrics")),
      side_group_(world_->view("side")) {}

int GroupCollectives::rank() const { return world_->rank(); }
int GroupCollectives::world_size() const { return world_->size(); }
void GroupCollectives::barrier() { world_->barrier(); }

uint64_t GroupCollectives::broadcast_seed(uint64_t seed) {
  torch::Tensor value = torch::tensor({static_cast<int64_t>(seed & 0x7fffffffffffffffull)}, torch::kLong);
  world_->broadcast(value, 0);
  return static_cast<uint64_t>(value.item<int64_t>());
}

nlohmann::json GroupCollectives::broadcast_from_main(const nlohmann::json& value) {
  return broadcast_object(value, 0, world_);
}

bool GroupCollectives::any_rank(bool local) { return any_rank_true(*world_, local); }

bool GroupCollectives::same_on_every_rank(int64_t value) {
  torch::Tensor extremes = torch::tensor({value, -value}, torch::kLong);  // max and -min in one all-reduce
  world_->all_reduce(extremes, ReduceOp::kMax);
  return extremes[0].item<int64_t>() == -extremes[1].item<int64_t>();
}

std::vector<nlohmann::json> GroupCollectives::all_gather_json(const nlohmann::json& value) {
  return all_gather_object(value, world_);
}

void GroupCollectives::agree(const std::string& phase, const std::function<void()>& body) {
  agree_on_outcome(*world_, phase, body);
}

Collectives::TensorCollectives GroupCollectives::tensor_collectives() {
  std::shared_ptr<ProcessGroup> group = world_;
  TensorCollectives collectives;
  collectives.average = [group](torch::Tensor& tensor) { group->all_reduce(tensor, ReduceOp::kAvg); };
  collectives.broadcast = [group](torch::Tensor& tensor) { group->broadcast(tensor, /*root=*/0); };
  return collectives;
}

MetricsGatherer GroupCollectives::metrics_gatherer() {
  std::shared_ptr<ProcessGroup> group = metrics_group_;
  return [group](const LogVars& local) {
    std::vector<LogVars> all;
    for (const auto& encoded : all_gather_object(encode_metrics(local), group)) {
      all.push_back(decode_metrics(encoded));
    }
    return all;
  };
}

std::vector<nlohmann::json> GroupCollectives::collect_results(const std::vector<nlohmann::json>& local,
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
