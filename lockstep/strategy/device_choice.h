// Which device a rank trains on, chosen before anything is allocated.
//
//   strategy:
//     device: auto      # auto | cpu | cuda | cuda:N   (default: auto)
//
// auto gives each local rank its own GPU, cuda:LOCAL_RANK, when the machine
// has a GPU for every local rank (LOCAL_WORLD_SIZE); otherwise every rank
// runs on the CPU, and local rank 0 logs one line saying why and how to
// choose (Note [auto never fails for want of GPUs]). cuda is cuda:LOCAL_RANK
// and fails without a GPU for it. One process per GPU, as torchrun and
// PyTorch's DDP expect: an explicit cuda never puts two ranks on one GPU.
//
//   torch::Device d = lockstep::choose_device("auto", {/*rank=*/1, /*of=*/2}, /*cuda_devices=*/2, "strategy.device");
//   // cuda:1; with 1 GPU: cpu, and auto_device_fallback(...) says why
//   torch::Device here = lockstep::place_on_device("auto", {local_rank, local_world_size}, "strategy.device");
//   // the same with the GPUs this process sees, and cuda:N made current (c10::cuda::set_device)
#pragma once

#include <string>

#include <torch/types.h>

namespace lockstep {

// Where a process sits on its machine: LOCAL_RANK and LOCAL_WORLD_SIZE as
// the launcher gives them (rank -1: no launcher, one process; size -1: the
// launcher does not say).
struct LocalPlace {
  int rank = -1;
  int size = 1;
};

// Pure: the device for `requested` at `place` given the number of visible
// GPUs. Throws lockstep::Error naming `where` for an unknown device or an
// impossible one.
torch::Device choose_device(const std::string& requested, LocalPlace place, int cuda_devices, const std::string& where);

// Why `auto` chose the CPU although GPUs are visible (too few for the local
// ranks), with how to choose otherwise; empty when it did not.
std::string auto_device_fallback(const std::string& requested, LocalPlace place, int cuda_devices);

// choose_device with this process's GPUs; a CUDA choice becomes the current
// device, so that NCCL communicators, streams and allocations land on it. Local
// rank 0 logs auto_device_fallback's line when there is one.
torch::Device place_on_device(const std::string& requested, LocalPlace place, const std::string& where);

}  // namespace lockstep
