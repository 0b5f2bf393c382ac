// FSDPStrategy: sharded data-parallel training (mmengine's FSDPStrategy).
//
// Starts the process group like DDPStrategy, wraps the model in
// FullyShardedDataParallel as `model_wrapper` says, builds the optimizer over
// each rank's shards only (so its state is sharded too), and saves:
//   state_dict_type: full     one file, written by rank 0: the whole model
//                             (full precision, CPU) and the optimizer state in
//                             the layout of an unwrapped model, so
//                             SingleDeviceStrategy and DDPStrategy load and
//                             resume it, and FSDP on any number of ranks too;
//   state_dict_type: sharded  every rank writes "<path>.rank<r>-of-<n>.shard"
//                             with its shards and optimizer state, rank 0
//                             writes <path> with the layout and everything
//                             else. It resumes bitwise with the same number
//                             of ranks; with another number (an elastic job
//                             that shrank or grew) each rank cuts its shards
//                             and their optimizer state out of the saved
//                             shards, reading only the elements that overlap
//                             its own. Same model and wrap policy either way.
//                             `lockstep ckpt export` makes one safetensors
//                             file of its weights.
//   state_dict_type: dcp      PyTorch's torch.distributed.checkpoint: every
//                             rank writes its elements of each parameter and
//                             of its optimizer state into "<path stem>.dcp/",
//                             named as get_model_state_dict and
//                             get_optimizer_state_dict name them ("model.",
//                             "optim."), so PyTorch's dcp.load reads it at any
//                             world size; rank 0 writes <path>, the rest of
//                             the checkpoint. Needs use_orig_params (FullyShard
//                             has it, and its `sharded` means this). Resumes at
//                             any world size, each rank reading only its part.
//                             A DCP directory PyTorch wrote resumes too (resume
//                             with load_from: <directory>). async_save: true
//                             writes it on a thread of its own while training
//                             goes on, as DCP's async_save.
// mmengine's `state_dict_cfg: full | local` is accepted for state_dict_type.
//
//   strategy:
//     type: FSDPStrategy
//     launcher: pytorch
//     backend: gloo
//     state_dict_type: full
//     model_wrapper:                       # FSDPOptions (fsdp_options.h)
//       type: MMFullyShardedDataParallel   # or FullyShardedDataParallel
//       sharding_strategy: FULL_SHARD
//       backward_prefetch: pre             # none + overlap_reductions: false = least memory
//       cpu_offload: false
//       auto_wrap_policy: {type: size_based, min_num_params: 1e6}
//       mixed_precision: {param_dtype: bf16, reduce_dtype: fp32}
//       use_orig_params: false             # true: paramwise_cfg works (see below)
//
// One optimizer per model (no OptimWrapperDict). By default it steps one
// flat shard per unit, which mixes the unit's parameters, so paramwise_cfg is
// refused. With use_orig_params: true it steps each original parameter's part
// of the shards instead, grouped by paramwise_cfg exactly as DDPStrategy groups
// the whole model (norm_decay_mult, bias_decay_mult, custom_keys, lr mults).
// Full checkpoints hold the optimizer state of an unwrapped model in both
// cases, with each position's parameter name: they move between FSDP (either
// setting, any number of ranks), DDP and one process.
#pragma once

#include <memory>
#include <string>

#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/config/config.h"
#include "lockstep/parallel/fsdp/fully_sharded_data_parallel.h"
#include "lockstep/strategy/background_save.h"
#include "lockstep/strategy/distributed_strategy.h"

namespace lockstep {

enum class StateDictType { kFull, kSharded, kDcp };

struct FSDPStrategyOptions {
  DistributedOptions distributed;
  FSDPOptions fsdp;
  StateDictType state_dict_type = StateDictType::kFull;
  bool async_save = false;  // kDcp only: written on a thread of its own (Note [Saving in the background])
};

FSDPStrategyOptions parse_fsdp_strategy_options(const Config& config);

class FSDPStrategy : public DistributedStrategy, public std::enable_shared_from_this<FSDPStrategy> {
 public:
  explicit FSDPStrategy(FSDPStrategyOptions options);
  std::string name() const override { return "FSDPStrategy"; }

  std::shared_ptr<FullyShardedDataParallel> fsdp() const { return fsdp_; }
  // Inside a ShardWhileBuilding scope: units built through shard_when_built()
  // are sharded as they are made, so the whole model never exists on a rank.
  std::shared_ptr<Model> build_model(const Config& config) override;
  std::string cuda_graph_obstacle() const override;

  // Rank 0 gets the full state; the other ranks an empty map (collective).
  std::map<std::string, torch::Tensor> model_state_dict() override;
  LoadReport load_model_state_dict(const std::map<std::string, torch::Tensor>& weights, bool strict,
                                   const std::string& source) override;
  void save_checkpoint(const std::string& path, CheckpointContents contents,
                       const CheckpointOptions& options) override;
  void save_checkpoint_then(const std::string& path, CheckpointContents contents, const CheckpointOptions& options,
                            std::function<void()> committed) override;
  void after_checkpoint_saves(std::function<void()> action) override;
  void finish_checkpoint_saves() override;
  // Strategy::load_checkpoint inside load_into_shards.
  CheckpointContents load_checkpoint(const std::string& path, bool load_optimizer, bool load_schedulers,
                                     bool strict = true) override;
  void load_sharded_weights(const std::string& path, bool strict) override;

 protected:
  void place_model(Model& model) override;
  WeightAveraging weight_averaging() override;
  std::shared_ptr<OptimWrapperBase> build_optim_wrapper_for(const Config& config, Model& model) override;

 private:
  // That a sharded checkpoint's optimizer state has this run's layout (flat
  // shards or use_orig_params' parts); an error naming `path` otherwise.
  void check_same_optimizer_layout(const nlohmann::json& saved_layout, const std::string& path) const;
  // Runs `load` (this rank's part of a load: local), agrees with every rank
  // that each loaded, then gathers again what stays gathered (Note [Loading,
  // then gathering]). Collective.
  void load_into_shards(const std::string& what, const std::function<void()>& load);
  // load_model_state_dict's part on this rank (local).
  LoadReport load_full_weights(const std::map<std::string, torch::Tensor>& weights, bool strict,
                               const std::string& source);
  // A full checkpoint (from any strategy) or a sharded one of FSDPStrategy,
  // on this rank (local).
  CheckpointContents load_checkpoint_contents(const std::string& path, CheckpointContents contents,
                                              bool load_optimizer, bool load_schedulers, bool strict) override;
  // Loads the model (and the optimizer) of a sharded checkpoint written by
  // another number of ranks, or ranks per shard group.
  void load_resharded(const std::string& path, const CheckpointContents& contents, bool load_optimizer);
  // state_dict_type: dcp (Note [DCP checkpoints of lockstep train]): what
  // every rank writes, staged (copied, for a save in the background).
  struct StagedDcpSave {
    std::string path;
    std::string dir;
    DcpRankPart part;
    CheckpointContents contents;  // the manifest's
  };
  StagedDcpSave stage_dcp_save(const std::string& path, CheckpointContents contents, const CheckpointOptions& options,
                               bool copy);
  void save_dcp_checkpoint(const std::string& path, CheckpointContents contents, const CheckpointOptions& options);
  // This rank's shards of the DCP directory `dir` (and the optimizer's state).
  int64_t read_dcp(const std::string& dir, bool optimizer, const std::string& what) override;

  FSDPStrategyOptions options_;
  std::shared_ptr<FullyShardedDataParallel> fsdp_;
  std::shared_ptr<ProcessGroup> checkpoint_channel_;  // the saving thread's (a side channel of world_)
  BackgroundSave saver_;                              // destroyed first: waits for the save in flight
};

}  // namespace lockstep
