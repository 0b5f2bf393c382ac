// Building a model that does not fit in one process: each FSDP unit is
// sharded the moment its constructor returns, so a rank never holds more than
// its shards, the root and one unit, on the host as on the device.
//
// The model opts in by passing each unit through shard_when_built() in its
// own constructor. FSDPStrategy builds the model inside a ShardWhileBuilding
// scope (Strategy::build_model); without one (DDP, one process, FSDP wrapped
// by hand around a model built whole) shard_when_built() hands the unit back
// untouched. The same constructor runs either way and draws the same random
// numbers in the same order, so for the same seed the sharded model holds
// exactly the values of the model built whole: the scope changes where the
// values go, never how they are made.
//
//   GPT(const GPTOptions& options) {
//     tok_emb = register_module("tok_emb", torch::nn::Embedding(...));    // root: built whole
//     blocks = register_module("blocks", torch::nn::ModuleList());
//     for (int64_t i = 0; i < options.n_layer(); ++i)
//       blocks->push_back(lockstep::fsdp::shard_when_built(Block(options, i)));
//   }
//
// What such a unit promises:
//   - its constructor initialises it completely: nothing writes its
//     parameters afterwards (a model-wide init loop after construction would
//     write into placeholders; initialise each unit inside its constructor);
//   - it shares no parameter with the rest of the model, and FSDP's wrap
//     policy picks no unit inside it;
//   - its trainable parameters have one dtype. Frozen parameters and buffers
//     stay whole, as FSDP keeps them.
// FullyShardedDataParallel makes every such module a unit (besides those its
// wrap policy picks) and checks that the shard it finds was cut for its own
// layout, naming the unit and the difference otherwise. Until then the unit's
// parameters are NaN placeholders of their shapes, holding one element each.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/macros/Macros.h>
#include <torch/nn/module.h>
#include <torch/types.h>

namespace lockstep {
class ProcessGroup;
}  // namespace lockstep

namespace lockstep::fsdp {

// How the FSDP that will wrap the model shards each unit.
struct ShardPlan {
  int shard_rank = 0;
  int shard_world = 1;
  torch::Device compute_device = torch::kCPU;  // where the unit is broadcast
  torch::Device shard_device = torch::kCPU;    // where the shard is kept
  // Set: each unit is broadcast from its rank 0 first (sync_module_states).
  std::shared_ptr<ProcessGroup> sync_group;
};

// While alive, shard_when_built() shards on this thread (one scope at a time).
class ShardWhileBuilding {
 public:
  explicit ShardWhileBuilding(ShardPlan plan);
  ~ShardWhileBuilding();
  C10_DISABLE_COPY_AND_ASSIGN(ShardWhileBuilding);
};

// A unit's flat parameter, cut while building: this rank's shard of the
// trainable parameters laid out back to back in named_parameters() order.
struct PrebuiltShard {
  ShardPlan plan;
  torch::Tensor shard;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;  // names within the unit, shapes
};

namespace detail {
void shard_now(const std::shared_ptr<torch::nn::Module>& unit);
}  // namespace detail

// Shards `unit` if a ShardWhileBuilding scope is open; returns it either way.
template <typename ModuleHolder>
ModuleHolder shard_when_built(ModuleHolder unit) {
  detail::shard_now(unit.ptr());
  return unit;
}
inline std::shared_ptr<torch::nn::Module> shard_when_built(std::shared_ptr<torch::nn::Module> unit) {
  detail::shard_now(unit);
  return unit;
}

// Whether `module` was sharded while building and not yet taken (a shard
// whose module is gone is forgotten).
bool has_prebuilt_shard(const torch::nn::Module* module);
// Hands the shard over to FSDP (and forgets it).
std::optional<PrebuiltShard> take_prebuilt_shard(const torch::nn::Module* module);

}  // namespace lockstep::fsdp
