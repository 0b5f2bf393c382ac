// FullyShard: FSDP2, PyTorch's `fully_shard`, configured with its own
// argument names. Each parameter is sharded on dim 0 on its own (Note
// [Per-parameter layout] in flat_layout.h); the optimizer steps each
// parameter's local rows, so paramwise_cfg works as under DDP; a parameter
// that got no gradient keeps none and is not decayed (Note [FSDP2's
// gradients] in shard_gradients.cpp). It runs on FSDP's runtime
// (fully_sharded_data_parallel.h: units, prefetching, the step check), with
// these options.
//
//   strategy:
//     type: FSDPStrategy
//     model_wrapper:
//       type: FullyShard
//       auto_wrap_policy: {type: module_type, module_types: [Block]}   # the modules fully_shard is applied to
//       reshard_after_forward: true          # false: keep each unit gathered from forward to its backward;
//                                            # k (a number): reshard over groups of k ranks (a node) after forward
//       mp_policy: {param_dtype: bf16, reduce_dtype: fp32, cast_forward_inputs: true,
//                   output_dtype: fp32}     # every unit's output and the model's losses cast to it
//       offload_policy: {type: CPUOffloadPolicy}                     # or null
//       mesh: [2, 4]                         # optional: HSDP, 2 replicas of shard groups of 4 consecutive ranks
//       reduce_scatter: ring                 # or native: the backend's own op, bitwise as PyTorch's at any
//                                            # world size (Note [Whose reduce-scatter] in unit_builder.cpp)
//       backward_prefetch: pre               # none, with overlap_reductions: false, keeps one unit gathered
//       overlap_reductions: true             # at a time: the least memory, as FSDP's (fsdp_options.h)
//
// As in PyTorch, fully_shard is applied to the modules the policy picks and
// then to the root, which takes every parameter no unit holds. A unit may
// hold frozen parameters of another dtype than its trainable ones (a bf16
// base beside fp32 adapters: model.frozen_dtype; Note [A unit of several
// dtypes] in unit_builder.cpp).
//
//   lockstep::FSDPOptions options = lockstep::parse_fully_shard_options(config.at("model_wrapper"));
#pragma once

#include "lockstep/config/config.h"
#include "lockstep/parallel/fsdp/fsdp_options.h"

namespace lockstep {

// Reads the keys above (none is required) into FSDP's options, with
// per_parameter_sharding and use_orig_params set; `type` is the caller's.
FSDPOptions parse_fully_shard_options(const Config& config);

}  // namespace lockstep
