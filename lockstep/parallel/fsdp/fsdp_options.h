// FSDPOptions: how FullyShardedDataParallel shards, prefetches, offloads and
// casts (PyTorch FSDP's constructor arguments, as mmengine configures them).
//
//   auto options = lockstep::FSDPOptions()
//                      .sharding_strategy(lockstep::ShardingStrategy::kFullShard)
//                      .backward_prefetch(lockstep::BackwardPrefetch::kPre)
//                      .auto_wrap_policy(lockstep::size_based_wrap_policy(1'000'000))
//                      .mixed_precision(lockstep::MixedPrecision().param_dtype(torch::kBFloat16));
//
// From config (the `model_wrapper` of FSDPStrategy, see fsdp_strategy.h):
//   sharding_strategy: FULL_SHARD          # SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD
//   backward_prefetch: pre                 # pre | post | none (mmengine's strings)
//   forward_prefetch: false
//   limit_all_gathers: 2                   # units gathered at once by prefetching; true = 2, false = no limit
//   cpu_offload: false                     # or {offload_params: true}
//   mixed_precision: {param_dtype: bf16, reduce_dtype: fp32, buffer_dtype: fp32,
//                     cast_root_forward_inputs: true, cast_forward_inputs: false}
//   auto_wrap_policy: {type: size_based, min_num_params: 1e6}
//   hybrid_shard_size: 0                   # HYBRID_SHARD: ranks per shard group (0: the node)
//   hierarchical_all_reduce: auto          # replica reductions within nodes, then across (auto | true | false)
//   accumulate_unsharded: false            # see below
//   overlap_reductions: true               # see below
//   use_orig_params: false                 # see below
#pragma once

#include <memory>
#include <string>

#include <torch/arg.h>
#include <torch/types.h>

#include "lockstep/config/config.h"
#include "lockstep/parallel/fsdp/wrap_policy.h"

namespace lockstep {

enum class ShardingStrategy {
  kFullShard,    // gather before forward, free after; gather again for backward; reduce-scatter grads
  kShardGradOp,  // keep the gathered parameters from forward until the unit's backward is done
  kNoShard,      // every rank holds everything; gradients are all-reduced (DDP)
  kHybridShard,  // FULL_SHARD inside a shard group (a node), all-reduce across groups
};
enum class BackwardPrefetch {
  kNone,
  kPre,   // gather the next unit (in backward order) when this unit's backward starts
  kPost,  // gather the next unit when this unit's gradients are ready
};

const char* to_string(ShardingStrategy strategy);
const char* to_string(BackwardPrefetch prefetch);
// "FULL_SHARD" / "full_shard", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"; `where` names the config key.
ShardingStrategy parse_sharding_strategy(const std::string& text, const std::string& where);
// "pre" / "BACKWARD_PRE", "post" / "BACKWARD_POST", "none".
BackwardPrefetch parse_backward_prefetch(const std::string& text, const std::string& where);

// Dtypes for computation; unset keeps the parameter's / buffer's own dtype.
// The optimizer always steps full-precision shards.
struct MixedPrecision {
  bool enabled() const { return param_dtype_.has_value() || reduce_dtype_.has_value() || buffer_dtype_.has_value(); }
  TORCH_ARG(c10::optional<torch::Dtype>, param_dtype);   // gathered parameters (forward and backward)
  TORCH_ARG(c10::optional<torch::Dtype>, reduce_dtype);  // gradient communication (default: param_dtype)
  TORCH_ARG(c10::optional<torch::Dtype>, buffer_dtype);  // buffers while training (state dicts keep their own dtype)
  // Floating-point inputs of the model (its data preprocessor's output) are
  // cast to param_dtype; and with cast_forward_inputs, the input of every
  // unit that is a Sequential entry too. PyTorch's MixedPrecision defaults.
  TORCH_ARG(bool, cast_root_forward_inputs) = true;
  TORCH_ARG(bool, cast_forward_inputs) = false;
  // fully_shard's output_dtype: the floating-point outputs of every unit (what
  // passes through its scope's output(), a Sequential entry's result) and of
  // the model itself (its losses and predictions) are cast to it.
  TORCH_ARG(c10::optional<torch::Dtype>, output_dtype);
};

struct FSDPOptions {
  TORCH_ARG(ShardingStrategy, sharding_strategy) = ShardingStrategy::kFullShard;
  TORCH_ARG(BackwardPrefetch, backward_prefetch) = BackwardPrefetch::kPre;
  // Gather the next unit (in the first iteration's forward order) while this one computes.
  TORCH_ARG(bool, forward_prefetch) = false;
  // Prefetching never makes more than this many units gathered at once (a
  // unit needed now is always gathered); 0: no limit.
  TORCH_ARG(int, limit_all_gathers) = 2;
  // Keep shards and their gradients in host memory when computing on a GPU
  // (the optimizer then steps on the CPU). Accepted and harmless on CPU.
  TORCH_ARG(bool, offload_params) = false;
  TORCH_ARG(MixedPrecision, mixed_precision);
  // Null: one unit, the root (everything gathered at once, like NO_SHARD's memory).
  TORCH_ARG(std::shared_ptr<WrapPolicy>, auto_wrap_policy);
  // HYBRID_SHARD: consecutive ranks per shard group; 0 uses the ranks of this node.
  TORCH_ARG(int, hybrid_shard_size) = 0;
  // HYBRID_SHARD: how many shard groups the world must make (FullyShard's
  // 2-D mesh, [replicas, shard size]); 0: as many as the world size gives.
  TORCH_ARG(int, hybrid_replicas) = 0;
  // How the replica reduction (NO_SHARD, HYBRID_SHARD) all-reduces across a
  // multi-node replica group: "auto" hierarchically when a node holds several
  // of its ranks (within the node, then across nodes), "on", "off"; see
  // comm/hierarchy.h. A replica group of one rank per node is flat either way.
  TORCH_ARG(std::string, hierarchical_all_reduce) = "auto";
  // Gradient accumulation. false (default): every micro-step reduce-scatters
  // and adds into the sharded gradient, so no full-size gradient outlives a
  // unit's backward (memory stays 1/N; communication every micro-step).
  // true: micro-steps that do not sync keep each unit's full gradients on
  // its parameters and skip communication, and the syncing micro-step reduces
  // the sum (PyTorch's no_sync: less communication, full-size gradients).
  TORCH_ARG(bool, accumulate_unsharded) = false;
  // true (default): a unit's gradient reduction runs while the next unit's
  // backward computes (one reduction in flight). false: it finishes before
  // the next unit's backward starts; with backward_prefetch none, at most one
  // unit's parameters and one unit's gradients are unsharded at any moment --
  // the least memory FSDP can train in, paid for in lost overlap.
  TORCH_ARG(bool, overlap_reductions) = true;
  // Copy rank 0's parameters and buffers to every rank before sharding.
  TORCH_ARG(bool, sync_module_states) = true;
  // The optimizer steps the original parameters' parts of each shard, one
  // tensor per parameter (FullyShardedDataParallel::named_orig_parameters()),
  // instead of one flat shard per unit: what per-parameter options
  // (paramwise_cfg: weight decay and lr multipliers per parameter) need, as
  // PyTorch's use_orig_params=True. The same memory and communication;
  // elementwise optimizers (SGD, Adam, AdamW, RMSprop) step the same values.
  TORCH_ARG(bool, use_orig_params) = false;
  // FSDP2 (PyTorch's fully_shard; fully_shard_options.h sets it with
  // use_orig_params): every parameter sharded on dim 0 on its own
  // (Note [Per-parameter layout] in flat_layout.h), gradients averaged as
  // fully_shard averages them, and a parameter without a gradient keeps none
  // (Note [FSDP2's gradients] in shard_gradients.cpp).
  TORCH_ARG(bool, per_parameter_sharding) = false;
  // FullyShard's reshard_after_forward: k (FULL_SHARD, per-parameter): after
  // forward each unit stays sharded over groups of k consecutive ranks, so
  // its backward gathers within one (Note [Resharding to a smaller group] in
  // flat_param.cpp). 0: over the whole shard group.
  TORCH_ARG(int, reshard_after_forward_to) = 0;
  // Reduce-scatter with the backend's own op (c10d's _reduce_scatter_base,
  // what PyTorch's FSDP calls) instead of lockstep's ring over Gloo: the same
  // sums in the same order as PyTorch at every world size, slower on Gloo
  // (Note [Whose reduce-scatter] in unit_builder.cpp). NCCL's is native either way.
  TORCH_ARG(bool, native_reduce_scatter) = false;
  // The device the units compute on (PyTorch's device_id). Set, the model may
  // stay on the host: each unit is flattened there, moved to this device,
  // sharded and freed before the next, so the device never holds more than
  // the shards, the root and one unit (buffers and frozen parameters move
  // whole). Unset: the device the parameters are on. FSDPStrategy sets it.
  TORCH_ARG(c10::optional<torch::Device>, device_id);
};

// Reads the keys listed at the top of this file (none is required).
FSDPOptions parse_fsdp_options(const Config& config, const FSDPOptions& defaults = FSDPOptions());
// backward_prefetch and overlap_reductions (FSDP's and FullyShard's): what
// is kept in flight beside the unit computing, the least memory with none and false.
void read_overlap_options(const Config& config, FSDPOptions& options);
// parse_dtype (core/dtype_name.h) of `key` of a map; unset when the key is absent or null.
c10::optional<torch::Dtype> read_optional_dtype(const Config& config, const std::string& key);

}  // namespace lockstep
