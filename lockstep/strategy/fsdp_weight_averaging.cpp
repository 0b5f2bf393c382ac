// FSDPStrategy::weight_averaging: averages of the weights (EMAHook) under FSDP.
#include <torch/torch.h>

#include "lockstep/checkpoint/internal/ema_state_keys.h"
#include "lockstep/core/error.h"
#include "lockstep/model/model.h"  // IWYU pragma: keep (Model's torch::nn::Module members)
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"
#include "lockstep/strategy/fsdp_strategy.h"

namespace lockstep {

namespace {

// The shards each rank's optimizer steps, and checkpoint state
// through the strategy's full state dict (the average swapped into the
// shards for a moment, so the strategy gathers or shards it as it does the
// model's weights). Collective: every rank saves and loads together.
std::function<std::map<std::string, torch::Tensor>()> fsdp_shards(const std::shared_ptr<FSDPStrategy>& fsdp) {
  return [fsdp] {
    std::map<std::string, torch::Tensor> shards;
    for (const auto& [name, shard] : fsdp->fsdp()->named_shard_parameters()) shards[name] = shard;
    return shards;
  };
}

// Exchanges the shards' (and averaged buffers') values with the average's.
void swap_shards(FSDPStrategy& fsdp, std::map<std::string, torch::Tensor>& average) {
  torch::NoGradGuard no_grad;
  auto exchange = [](torch::Tensor live, torch::Tensor& averaged) {
    torch::Tensor held = live.detach().clone();
    live.detach().copy_(averaged);
    averaged.copy_(held);
  };
  for (const auto& [name, shard] : fsdp.fsdp()->named_shard_parameters()) {
    exchange(shard, average.at(ema_keys::kParameter + name));
  }
  for (const auto& item : fsdp.model()->named_buffers()) {
    auto found = average.find(ema_keys::kBuffer + item.key());
    if (found != average.end()) exchange(item.value(), found->second);
  }
  fsdp.fsdp()->shards_changed();
}

void set_fsdp_codec(const std::shared_ptr<FSDPStrategy>& fsdp, Strategy::WeightAveraging& codec) {
  codec.save = [fsdp](const std::map<std::string, torch::Tensor>& average) {
    // A copy of the map shares the hook's tensors: the average is swapped
    // into the model and back, leaving every value as it was.
    auto swapped = average;
    swap_shards(*fsdp, swapped);
    State state;
    try {
      for (auto& [name, tensor] : fsdp->model_state_dict()) state.tensors[ema_keys::kGathered + name] = tensor;
    } catch (...) {
      swap_shards(*fsdp, swapped);
      throw;
    }
    swap_shards(*fsdp, swapped);
    return state;
  };
  codec.load = [fsdp](const State& state, std::map<std::string, torch::Tensor>& average) {
    std::map<std::string, torch::Tensor> full;
    for (const auto& [name, tensor] : state.tensors) {
      if (name.rfind("full/", 0) == 0) full[name.substr(5)] = tensor;
    }
    LOCKSTEP_CHECK(!full.empty(), "EMAHook state: no averaged model (full/...) in the checkpoint");
    // Load the average as if it were the weights, keep what landed in the
    // shards (and buffers), and put the weights back.
    torch::NoGradGuard no_grad;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> kept;  // live tensor, its value
    for (const auto& [name, shard] : fsdp->fsdp()->named_shard_parameters()) kept.emplace_back(shard, shard.detach().clone());
    for (const auto& item : fsdp->model()->named_buffers()) kept.emplace_back(item.value(), item.value().clone());
    fsdp->load_model_state_dict(full, /*strict=*/true, "the EMAHook state");
    for (const auto& [name, shard] : fsdp->fsdp()->named_shard_parameters()) {
      average.at(ema_keys::kParameter + name).copy_(shard);
    }
    for (const auto& item : fsdp->model()->named_buffers()) {
      auto found = average.find(ema_keys::kBuffer + item.key());
      if (found != average.end()) found->second.copy_(item.value());
    }
    for (auto& [live, value] : kept) live.detach().copy_(value);
    fsdp->fsdp()->shards_changed();
  };
}

}  // namespace

// The functions hold the strategy (hooks never own it back), so it must be
// owned by a std::shared_ptr, as every strategy the runner builds is.
Strategy::WeightAveraging FSDPStrategy::weight_averaging() {
  std::shared_ptr<FSDPStrategy> self = weak_from_this().lock();
  LOCKSTEP_CHECK(self != nullptr, "FSDPStrategy::weight_averaging: the strategy must be owned by a std::shared_ptr");
  WeightAveraging averaging;
  averaging.stepped_parameters = fsdp_shards(self);
  set_fsdp_codec(self, averaging);
  averaging.after_swap = [self] { self->fsdp()->shards_changed(); };
  return averaging;
}

}  // namespace lockstep
