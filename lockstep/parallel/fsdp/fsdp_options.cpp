#include "lockstep/parallel/fsdp/fsdp_options.h"

#include <algorithm>
#include <cctype>

#include "lockstep/config/key_usage.h"
#include "lockstep/core/dtype_name.h"
#include "lockstep/core/error.h"
#include "lockstep/comm/hierarchy.h"

namespace lockstep {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

}  // namespace

c10::optional<torch::Dtype> read_optional_dtype(const Config& config, const std::string& key) {
  if (config.child(key).is_null()) return c10::nullopt;
  return parse_dtype(config.get<std::string>(key), config.where(key));
}

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

const char* to_string(BackwardPrefetch prefetch) {
  switch (prefetch) {
    case BackwardPrefetch::kNone: return "none";
    case BackwardPrefetch::kPre: return "pre";
    case BackwardPrefetch::kPost: return "post";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& text, const std::string& where) {
  const std::string key = lower(text);
  if (key == "full_shard") return ShardingStrategy::kFullShard;
  if (key == "shard_grad_op") return ShardingStrategy::kShardGradOp;
  if (key == "no_shard") return ShardingStrategy::kNoShard;
  if (key == "hybrid_shard") return ShardingStrategy::kHybridShard;
  LOCKSTEP_FAIL(where, ": sharding_strategy must be FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD, got '",
                text, "'");
}

BackwardPrefetch parse_backward_prefetch(const std::string& text, const std::string& where) {
  const std::string key = lower(text);
  if (key == "pre" || key == "backward_pre") return BackwardPrefetch::kPre;
  if (key == "post" || key == "backward_post") return BackwardPrefetch::kPost;
  if (key == "none" || key == "null") return BackwardPrefetch::kNone;
  LOCKSTEP_FAIL(where, ": backward_prefetch must be 'pre', 'post' or 'none', got '", text, "'");
}

void read_overlap_options(const Config& config, FSDPOptions& options) {
  if (config.has("backward_prefetch")) {
    Config prefetch = config.at("backward_prefetch");
    options.backward_prefetch(prefetch.is_null() ? BackwardPrefetch::kNone
                                                 : parse_backward_prefetch(prefetch.as<std::string>(),
                                                                           config.where("backward_prefetch")));
  }
  options.overlap_reductions(config.get<bool>("overlap_reductions", options.overlap_reductions()));
}

FSDPOptions parse_fsdp_options(const Config& config, const FSDPOptions& defaults) {
  FSDPOptions options = defaults;
  if (config.is_null()) return options;
  if (config.has("sharding_strategy")) {
    options.sharding_strategy(
        parse_sharding_strategy(config.get<std::string>("sharding_strategy"), config.where("sharding_strategy")));
  }
  read_overlap_options(config, options);
  options.forward_prefetch(config.get<bool>("forward_prefetch", defaults.forward_prefetch()));
  if (config.has("limit_all_gathers")) {
    const std::string text = lower(config.at("limit_all_gathers").text());
    if (text == "true" || text == "false") {
      options.limit_all_gathers(config.get<bool>("limit_all_gathers") ? 2 : 0);
    } else {
      options.limit_all_gathers(config.get<int>("limit_all_gathers"));
      LOCKSTEP_CHECK(options.limit_all_gathers() >= 0, config.where("limit_all_gathers"),
                     ": limit_all_gathers must not be negative");
    }
  }
  Config offload = config.child("cpu_offload");
  if (offload.is_scalar()) {
    options.offload_params(offload.as<bool>());
  } else if (offload.is_map()) {
    options.offload_params(offload.get<bool>("offload_params", false));
    check_all_used(offload, "cpu_offload");
  }
  Config precision = config.child("mixed_precision");
  if (precision.is_map()) {
    options.mixed_precision(MixedPrecision()
                                .param_dtype(read_optional_dtype(precision, "param_dtype"))
                                .reduce_dtype(read_optional_dtype(precision, "reduce_dtype"))
                                .buffer_dtype(read_optional_dtype(precision, "buffer_dtype"))
                                .cast_root_forward_inputs(precision.get<bool>("cast_root_forward_inputs", true))
                                .cast_forward_inputs(precision.get<bool>("cast_forward_inputs", false)));
    check_all_used(precision, "mixed_precision");
  } else {
    LOCKSTEP_CHECK(precision.is_null(), config.where("mixed_precision"),
                   ": mixed_precision must be a map such as {param_dtype: bf16, reduce_dtype: fp32}");
  }
  // mmengine 0.x calls it fsdp_auto_wrap_policy.
  for (const char* key : {"auto_wrap_policy", "fsdp_auto_wrap_policy"}) {
    if (config.has(key)) options.auto_wrap_policy(build_wrap_policy(config.at(key)));
  }
  options.hybrid_shard_size(config.get<int>("hybrid_shard_size", defaults.hybrid_shard_size()));
  options.hierarchical_all_reduce(parse_hierarchical_mode(config, defaults.hierarchical_all_reduce()));
  LOCKSTEP_CHECK(options.hybrid_shard_size() >= 0, config.where("hybrid_shard_size"),
                 ": hybrid_shard_size must not be negative");
  options.accumulate_unsharded(config.get<bool>("accumulate_unsharded", defaults.accumulate_unsharded()));
  options.sync_module_states(config.get<bool>("sync_module_states", defaults.sync_module_states()));
  options.use_orig_params(config.get<bool>("use_orig_params", defaults.use_orig_params()));
  return options;
}

}  // namespace lockstep
