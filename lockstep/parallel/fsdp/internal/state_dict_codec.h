// fsdp::StateDictCodec: FullyShardedDataParallel's state dicts and optimizer
// state, between the units' shards and what a checkpoint holds. Full state
// dicts are gathered unit by unit (one unit's full-precision flat parameter at
// a time); sharded ones are each rank's shards as they are, with the layout
// that must match on loading. Optimizer state converts between the sharded
// optimizer's layout and an unwrapped model's, both ways. Resharding a
// checkpoint of another shard world is in resharding.h.
//
//   fsdp::StateDictCodec codec(model);
//   auto weights = codec.full_state_dict(/*rank0_only=*/true);  // collective
//   codec.load_sharded_state_dict(state, "ckpt/rank1.pt");
#pragma once

#include <map>
#include <string>

#include <torch/torch.h>

#include "lockstep/core/load_report.h"
#include "lockstep/core/state.h"
#include "lockstep/parallel/fsdp/internal/sharded_model.h"

namespace lockstep::fsdp {

// The slot an optimizer position steps (use_orig_params).
struct SlotRef {
  const FlatParamUnit* unit;
  size_t slot;
};

class StateDictCodec {
 public:
  explicit StateDictCodec(ShardedModel& model) : model_(model) {}

  // The calls FullyShardedDataParallel documents under the same names.
  std::map<std::string, torch::Tensor> full_state_dict(bool rank0_only);
  LoadReport load_full_state_dict(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                  const std::string& source);
  State sharded_state_dict() const;
  void load_sharded_state_dict(const State& state, const std::string& source);
  nlohmann::json layout() const;
  State full_optimizer_state(const torch::optim::Optimizer& optimizer, const State& local, bool rank0_only);
  State shard_optimizer_state(const torch::optim::Optimizer& optimizer, const State& full) const;

  // An error naming `source` and the first difference if a checkpoint of
  // `saved` (a layout()) does not fit this model's units.
  void check_units_fit(const nlohmann::json& saved, const std::string& source, bool same_shard_world) const;
  // The slot each position "<group>.<index>" of `optimizer` steps (use_orig_params).
  std::map<std::string, SlotRef> orig_positions(const torch::optim::Optimizer& optimizer) const;

 private:
  // Optimizer state conversions, for flat shards and for original parameters.
  State full_flat_optimizer_state(const State& sharded, bool rank0_only);
  State shard_flat_optimizer_state(const State& full) const;
  State full_orig_optimizer_state(const torch::optim::Optimizer& optimizer, const State& local, bool rank0_only);
  State shard_orig_optimizer_state(const torch::optim::Optimizer& optimizer, const State& full) const;
  // position -> parameter name: of the unwrapped model's one group ("0.<i>", model order), or of `positions`.
  nlohmann::json flat_position_names() const;
  static nlohmann::json orig_position_names(const std::map<std::string, SlotRef>& positions);

  ShardedModel& model_;
};

}  // namespace lockstep::fsdp
