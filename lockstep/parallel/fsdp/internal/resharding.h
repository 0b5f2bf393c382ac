// fsdp::Resharding: loading a sharded FSDP checkpoint written by another
// number of ranks per shard group (PyTorch's DCP reshards the same way: by
// the saved pieces' places in each parameter). Local: each rank reads the
// elements of the saved shards that overlap its own, and no other.
//
//   fsdp::StateDictCodec codec(model);
//   fsdp::Resharding resharding(model, codec);
//   codec.load_sharded_state_dict(resharding.state_dict(saved_layout, readers), source);
#pragma once

#include <vector>

#include "lockstep/core/state.h"
#include "lockstep/core/state_reader.h"
#include "lockstep/parallel/fsdp/internal/sharded_model.h"
#include "lockstep/parallel/fsdp/internal/state_dict_codec.h"

namespace lockstep::fsdp {

class Resharding {
 public:
  Resharding(const ShardedModel& model, const StateDictCodec& codec) : model_(model), codec_(codec) {}

  // saved[s] is the part ("model" or "optim_wrapper/optimizer") of the file
  // of saved shard rank s, opened, not read.
  // This rank's sharded_state_dict():
  State state_dict(const nlohmann::json& saved_layout, const std::vector<StateReader>& saved) const;
  // This rank's state of `optimizer`, as the optimizer's own state() would be:
  State optimizer_state(const torch::optim::Optimizer& optimizer, const nlohmann::json& saved_layout,
                        const std::vector<StateReader>& saved) const;

 private:
  const ShardedModel& model_;
  const StateDictCodec& codec_;
};

}  // namespace lockstep::fsdp
