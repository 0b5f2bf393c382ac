#include "lockstep/parallel/fsdp/fully_shard_options.h"

#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// fully_shard's reshard_after_forward: true frees each unit after its
// forward (FULL_SHARD), false keeps it to its backward (SHARD_GRAD_OP).
ShardingStrategy read_reshard_after_forward(const Config& config) {
  if (!config.has("reshard_after_forward")) return ShardingStrategy::kFullShard;
  const Config value = config.at("reshard_after_forward");
  bool reshard = true;
  try {
    reshard = value.as<bool>();
  } catch (const Error&) {
    LOCKSTEP_FAIL(config.where("reshard_after_forward"), ": reshard_after_forward must be true or false, got '",
                  value.text(), "' (an integer, resharding to a smaller group after forward, is not supported yet)");
  }
  return reshard ? ShardingStrategy::kFullShard : ShardingStrategy::kShardGradOp;
}

MixedPrecision read_mp_policy(const Config& config) {
  const Config policy = config.child("mp_policy");
  if (policy.is_null()) return MixedPrecision();
  LOCKSTEP_CHECK(policy.is_map(), config.where("mp_policy"),
                 ": mp_policy must be a map such as {param_dtype: bf16, reduce_dtype: fp32}");
  LOCKSTEP_CHECK(policy.child("output_dtype").is_null(), policy.where("output_dtype"),
                 ": mp_policy.output_dtype is not supported yet; leave it unset (outputs keep param_dtype)");
  // fully_shard casts the floating-point inputs of every unit, the root's too.
  const bool cast_inputs = policy.get<bool>("cast_forward_inputs", true);
  MixedPrecision precision = MixedPrecision()
                                 .param_dtype(read_optional_dtype(policy, "param_dtype"))
                                 .reduce_dtype(read_optional_dtype(policy, "reduce_dtype"))
                                 .cast_root_forward_inputs(cast_inputs)
                                 .cast_forward_inputs(cast_inputs);
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
  options.sharding_strategy(read_reshard_after_forward(config));
  options.mixed_precision(read_mp_policy(config));
  options.offload_params(read_offload_policy(config));
  if (config.has("auto_wrap_policy")) options.auto_wrap_policy(build_wrap_policy(config.at("auto_wrap_policy")));
  return options;
}

}  // namespace lockstep
