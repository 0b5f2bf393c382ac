// DistributedStrategy: what every multi-process strategy shares.
//
// It picks this rank's device from LOCAL_RANK and makes it current before any
// process group or tensor exists (see device_choice.h), starts the process
// group from the launcher's environment (torchrun / `lockstep run`, SLURM or
// Open MPI; Gloo for CPU tensors, NCCL for CUDA ones), and hands the trainer,
// the hooks and the runner its collectives over that group (GroupCollectives,
// collectives.h).
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

#include "lockstep/comm/process_group.h"
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

 protected:
  std::shared_ptr<ProcessGroup> world_;
};

}  // namespace lockstep
