// DistributedStrategy: what every multi-process strategy shares.
//
// It picks this rank's device from LOCAL_RANK and makes it current before any
// process group or tensor exists (see device_choice.h), starts the process
// group from the launcher's environment (torchrun / `lockstep run`, SLURM or
// Open MPI; Gloo for CPU tensors, NCCL for CUDA ones), and gives the trainer and the runner
// their collective helpers: metrics gathered on a group of their own (so an
// asynchronous metrics writer never interleaves with gradient collectives or
// evaluation),
// a seed drawn on rank 0, evaluation records gathered in dataset order.
//
//   strategy:
//     type: DDPStrategy
//     launcher: pytorch      # pytorch | slurm | mpi | auto
//     device: auto           # auto | cpu | cuda (cuda:LOCAL_RANK)
//     backend: auto          # auto (nccl on GPUs, gloo on CPU) | gloo | nccl
//     timeout_s: 1800        # every collective wait, Gloo's and NCCL's
#pragma once

#include <memory>
#include <string>

#include "lockstep/dist/process_group.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {

class ProcessGroup;

struct DistributedOptions {
  TORCH_ARG(std::string, launcher) = "auto";
  TORCH_ARG(std::string, device) = "auto";
  // "auto": nccl when the device is a GPU, gloo otherwise.
  TORCH_ARG(std::string, backend) = "auto";
  // 0: lockstep's default (30 minutes, or LOCKSTEP_TIMEOUT_S).
  TORCH_ARG(double, timeout_s) = 0;
};

// launcher, device, backend, timeout_s.
DistributedOptions parse_distributed_options(const Config& config);

class DistributedStrategy : public Strategy {
 public:
  explicit DistributedStrategy(const DistributedOptions& options);

  int rank() const override;
  int world_size() const override;
  void barrier() override;
  MetricsGatherer metrics_gatherer() override;
  uint64_t broadcast_seed(uint64_t seed) override;
  nlohmann::json broadcast_from_main(const nlohmann::json& value) override;
  bool any_rank(bool local) override;
  bool same_on_every_rank(int64_t value) override;
  std::vector<nlohmann::json> all_gather_json(const nlohmann::json& value) override;
  void agree(const std::string& phase, const std::function<void()>& body) override;
  std::vector<nlohmann::json> collect_results(const std::vector<nlohmann::json>& local, int64_t dataset_size) override;
  TensorCollectives tensor_collectives() override;
  std::shared_ptr<ProcessGroup> world_group() const { return world_; }

 protected:
  std::shared_ptr<ProcessGroup> world_;
  // Note [A group per thread of collectives]: collectives of one group must be
  // issued in the same order on every rank, which only one thread per rank can
  // promise. The trainer's asynchronous metrics writer gathers from its own
  // thread while the main thread evaluates, so metrics go over a side channel
  // of the world group; evaluation records over a view of it, from the main
  // thread. Neither builds connections (Note [One mesh per process]).
  std::shared_ptr<ProcessGroup> metrics_group_;  // step metrics, from the metrics writer's thread
  std::shared_ptr<ProcessGroup> side_group_;     // evaluation records, from the main thread
};

}  // namespace lockstep
