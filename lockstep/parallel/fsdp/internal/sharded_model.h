// fsdp::ShardedModel: what FullyShardedDataParallel's three parts share, the
// model cut into units. UnitBuilder fills it once; StepRuntime gathers,
// frees and reduces its units step by step; StateDictCodec reads and writes
// it. None of them owns another.
//
//   fsdp::ShardedModel model{module, options};
//   fsdp::UnitBuilder::make_groups(model, group, "world.fsdp0");
//   fsdp::UnitBuilder builder(model, &step_check, on_grad_ready);
//   builder.build();                       // model.units now hold the shards
//   fsdp::StateDictCodec codec(model);     // codec.full_state_dict(), ...
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "lockstep/parallel/fsdp/flat_param.h"
#include "lockstep/parallel/fsdp/fsdp_options.h"

namespace lockstep::fsdp {

struct ShardedModel {
  std::shared_ptr<torch::nn::Module> module;
  FSDPOptions options;
  std::shared_ptr<ProcessGroup> group;            // this FSDP's own view of the given group
  std::shared_ptr<ProcessGroup> shard_group;      // null: no sharding (NO_SHARD)
  std::shared_ptr<ProcessGroup> replicate_group;  // null: no replication
  std::shared_ptr<ProcessGroup> post_forward_group;  // reshard_after_forward_to: this rank's k consecutive ranks
  // In unit order; unit 0 is the root when it holds parameters (Note [The
  // root unit], unit_builder.cpp).
  std::vector<std::unique_ptr<FlatParamUnit>> units;
  // Per unit: the unit it is gathered, freed and intercepted with (itself for
  // most), and the units that are gathered with it: the module's parameters of
  // other dtypes (FullyShard; Note [A unit of several dtypes], unit_builder.cpp).
  std::vector<int> leader_of;
  std::vector<std::vector<int>> companions;
  std::vector<std::pair<std::string, torch::Tensor>> frozen;   // parameters without gradients
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  std::map<std::string, torch::Dtype> buffer_dtypes;  // before buffer_dtype cast them; state dicts use these
  int64_t trainable_count = 0;                        // unique trainable parameters of the model
  int prebuilt_units = 0;                             // units cut while the model was built

  FlatParamUnit& unit(int index) const { return *units[static_cast<size_t>(index)]; }
  bool is_companion(int index) const { return leader_of[static_cast<size_t>(index)] != index; }
  // `index` and its companions, leader first.
  std::vector<int> parts_of(int index) const {
    std::vector<int> parts{index};
    const auto& more = companions[static_cast<size_t>(index)];
    parts.insert(parts.end(), more.begin(), more.end());
    return parts;
  }
};

}  // namespace lockstep::fsdp
