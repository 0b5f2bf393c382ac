// Which device a rank trains on, chosen before anything is allocated.
//
//   strategy:
//     device: auto      # auto | cpu | cuda | cuda:N   (default: auto)
//
// auto is cuda:LOCAL_RANK when GPUs are visible, else cpu; cuda is
// cuda:LOCAL_RANK and fails without GPUs. One process per GPU, as torchrun
// and PyTorch's DDP expect: LOCAL_RANK at or beyond the number of visible
// GPUs is an error, not a second process on the same GPU.
//
//   torch::Device d = lockstep::choose_device("auto", /*local_rank=*/1, /*cuda_devices=*/2, "strategy.device");
//   // cuda:1
//   torch::Device here = lockstep::place_on_device("auto", local_rank, "strategy.device");
//   // the same with the GPUs this process sees, and cuda:N made current (c10::cuda::set_device)
#pragma once

#include <string>

#include <torch/types.h>

namespace lockstep {

// Pure: the device for `requested` given this rank's LOCAL_RANK (-1 when the
// launcher gives none; treated as 0) and the number of visible GPUs. Throws
// lockstep::Error naming `where` for an unknown device or an impossible one.
torch::Device choose_device(const std::string& requested, int local_rank, int cuda_devices, const std::string& where);

// choose_device with this process's GPUs; a CUDA choice becomes the current
// device, so that NCCL communicators, streams and allocations land on it.
torch::Device place_on_device(const std::string& requested, int local_rank, const std::string& where);

}  // namespace lockstep
