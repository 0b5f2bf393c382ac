// One rank per GPU under NCCL, checked before NCCL is asked.
//
// NCCL cannot put two ranks of one communicator on the same GPU. How it fails
// depends on its version and on when ProcessGroupNCCL creates the
// communicator (at the first collective, on a background thread, in 2.x):
// "Duplicate GPU detected", an abort of the process, or a wait that ends
// only at the group timeout. So init_process_group asks first: every rank
// names its GPU by UUID (the same in every process, whatever
// CUDA_VISIBLE_DEVICES numbers it) through the job's store, and each rank
// whose GPU another rank also uses fails with a message that says so.
//
//   lockstep::check_one_rank_per_gpu(store, rank, world_size, "GPU-1490...", "cuda:0 (NVIDIA H100)", timeout);
#pragma once

#include <chrono>
#include <string>

#include "lockstep/compat/c10d.h"

namespace lockstep {

// Every rank of the group calls it with a store whose keys are fresh for this
// group. Throws lockstep::Error on each rank whose `gpu_uuid` another rank
// also holds, naming how many share it and `gpu_description`; returns on the
// others once every rank has named its GPU (a rank missing for `timeout`
// ends the wait with c10d's timeout error).
void check_one_rank_per_gpu(const c10::intrusive_ptr<compat::C10dStore>& store, int rank, int size,
                            const std::string& gpu_uuid, const std::string& gpu_description,
                            std::chrono::milliseconds timeout);

}  // namespace lockstep
