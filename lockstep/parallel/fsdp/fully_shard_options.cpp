#include "lockstep/parallel/fsdp/fully_shard_options.h"

#include <algorithm>
#include <cctype>

#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// fully_shard's reshard_after_forward: true frees each unit after its
// forward (FULL_SHARD), false keeps it to its backward (SHARD_GRAD_OP), an
// integer k reshards it over groups of k ranks (FULL_SHARD, reshard_after_forward_to).
void read_reshard_after_forward(const Config& config, FSDPOptions& options) {
  if (!config.has("reshard_after_forward")) return;
  const Config value = config.at("reshard_after_forward");
  const std::string& text = value.text();
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); })) {
    options.reshard_after_forward_to(value.as<int>());
    return;
  }
  bool reshard = true;
  try {
    reshard = value.as<bool>();
  } catch (const Error&) {
    LOCKSTEP_FAIL(config.where("reshard_after_forward"), ": reshard_after_forward must be true, false or a number "
                  "of ranks, got '", text, "'");
  }
  options.sharding_strategy(reshard ? ShardingStrategy::kFullShard : ShardingStrategy::kShardGradOp);
}

MixedPrecision read_mp_policy(const Config& config) {
  const Config policy = config.child("mp_policy");
  if (policy.is_null()) return MixedPrecision();
  LOCKSTEP_CHECK(policy.is_map(), config.where("mp_policy"),
                 ": mp_policy must be a map such as {param_dtype: bf16, reduce_dtype: fp32}");
  // fully_shard casts the floating-point inputs of every unit, the root's too.
  const bool cast_inputs = policy.get<bool>("cast_forward_inputs", true);
  MixedPrecision precision = MixedPrecision()
                                 .param_dtype(read_optional_dtype(policy, "param_dtype"))
                                 .reduce_dtype(read_optional_dtype(policy, "reduce_dtype"))
                                 .cast_root_forward_inputs(cast_inputs)
                                 .cast_forward_inputs(cast_inputs)
                                 .output_dtype(read_optional_dtype(policy, "output_dtype"));
  check_all_used(policy, "mp_policy");
  return precision;
}

bool read_offload_policy(const Config& config) {
  const Config policy = config.child("offload_policy");
  if (policy.is_null()) return false;
  LOCKSTEP_CHECK(policy.is_map() && policy.get<std::string>("type", "") == "CPUOffloadPolicy",
                 config.where("offload_policy"), ": offload_policy must be null or {type: CPUOffloadPolicy}");
  // Pinned whenever the host can pin (FlatParamUnit decides); accepted for PyTorch's spelling.
  policy.get<bool>("pin_memory", true);
  check_all_used(policy, "offload_policy");
  return true;
}

}  // namespace

FSDPOptions parse_fully_shard_options(const Config& config) {
  FSDPOptions options;
  options.per_parameter_sharding(true).use_orig_params(true);
  if (config.is_null()) return options;
  read_reshard_after_forward(config, options);
  options.mixed_precision(read_mp_policy(config));
  options.offload_params(read_offload_policy(config));
  if (config.has("mesh")) {
    // HSDP: fully_shard over a 2-D mesh (replicate, shard), as init_device_mesh((replicas, shards)) makes it.
    const auto mesh = config.get<std::vector<int>>("mesh");
    LOCKSTEP_CHECK(mesh.size() == 2 && mesh[0] >= 1 && mesh[1] >= 1, config.where("mesh"),
                   ": mesh must be [replicas, shard size], two positive integers (HSDP)");
    LOCKSTEP_CHECK(options.sharding_strategy() == ShardingStrategy::kFullShard, config.where("mesh"),
                   ": a 2-D mesh (HSDP) reshards after forward; reshard_after_forward: false is not supported with it");
    options.sharding_strategy(ShardingStrategy::kHybridShard).hybrid_shard_size(mesh[1]).hybrid_replicas(mesh[0]);
  }
  if (config.has("auto_wrap_policy")) options.auto_wrap_policy(build_wrap_policy(config.at("auto_wrap_policy")));
  read_overlap_options(config, options);
  if (config.has("reduce_scatter")) {
    const std::string algorithm = config.get<std::string>("reduce_scatter");
    LOCKSTEP_CHECK(algorithm == "ring" || algorithm == "native", config.where("reduce_scatter"),
                   ": reduce_scatter must be ring (lockstep's, the default) or native (the backend's own op, as "
                   "PyTorch calls it), got '", algorithm, "'");
    options.native_reduce_scatter(algorithm == "native");
  }
  return options;
}

}  // namespace lockstep
