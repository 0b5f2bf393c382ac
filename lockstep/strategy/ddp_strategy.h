// DDPStrategy: data parallel training across processes (mmengine's DDPStrategy).
//
// Initialises the process group from the launcher's environment, optionally
// converts BatchNorm layers to SyncBatchNorm, wraps the model as the config's
// `model_wrapper` says, saves checkpoints on rank 0 only and loads them on
// every rank.
//
//   strategy:
//     type: DDPStrategy
//     launcher: pytorch                  # see DistributedStrategy
//     backend: gloo
//     sync_bn: torch                     # BatchNorm -> SyncBatchNorm (omit to keep BatchNorm)
//     model_wrapper:
//       type: MMDistributedDataParallel  # or DistributedDataParallel, MMSeparateDistributedDataParallel
//       find_unused_parameters: false
//       broadcast_buffers: false         # mmengine's default for DDPStrategy
//       gradient_as_bucket_view: true
//       bucket_cap_mb: 25
//       comm_hook: fp16_compress         # allreduce | fp16_compress | bf16_compress | your own, or
//       # comm_hook: {type: PowerSGD, matrix_approximation_rank: 4, start_powerSGD_iter: 10}
//       hierarchical_all_reduce: auto    # multi-node jobs: within nodes, then across (auto | true | false)
#pragma once

#include <memory>
#include <string>

#include "lockstep/config/config.h"
#include "lockstep/parallel/ddp/distributed_data_parallel.h"
#include "lockstep/parallel/separate_ddp.h"
#include "lockstep/strategy/distributed_strategy.h"

namespace lockstep {

struct DDPStrategyOptions {
  DistributedOptions distributed;
  DDPOptions ddp = DDPOptions().broadcast_buffers(false);
  bool separate = false;           // one DDP per child network
  std::string sync_bn;             // "" or "torch"
  Config comm_hook;                // null: no hook (divide while bucketing, all_reduce)
};

DDPStrategyOptions parse_ddp_strategy_options(const Config& config);

class DDPStrategy : public DistributedStrategy {
 public:
  explicit DDPStrategy(DDPStrategyOptions options);
  std::string name() const override { return "DDPStrategy"; }
  std::string cuda_graph_obstacle() const override;

  // The DDP of the whole model (null with separate DDP).
  std::shared_ptr<DistributedDataParallel> ddp() const { return ddp_; }
  std::shared_ptr<SeparateDistributedDataParallel> separate_ddp() const { return separate_; }

 protected:
  void place_model(Model& model) override;
  std::shared_ptr<OptimWrapperBase> build_optim_wrapper_for(const Config& config, Model& model) override;

 private:
  DDPStrategyOptions options_;
  std::shared_ptr<DistributedDataParallel> ddp_;
  std::shared_ptr<SeparateDistributedDataParallel> separate_;
};

}  // namespace lockstep
