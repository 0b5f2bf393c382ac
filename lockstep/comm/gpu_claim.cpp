#include "lockstep/comm/gpu_claim.h"

#include "lockstep/core/error.h"

namespace lockstep {

void check_one_rank_per_gpu(const c10::intrusive_ptr<compat::C10dStore>& store, int rank, int size,
                            const std::string& gpu_uuid, const std::string& gpu_description,
                            std::chrono::milliseconds timeout) {
  if (size <= 1) return;
  // A counter per GPU; the last rank to count itself opens the gate.
  const std::string counter = "gpu/" + gpu_uuid;
  store->add(counter, 1);
  if (store->add("gpu_counted", 1) == size) store->set("gpu_all_counted", std::vector<uint8_t>{1});
  store->wait({"gpu_all_counted"}, timeout);
  const int64_t sharing = store->add(counter, 0);
  LOCKSTEP_CHECK(sharing == 1, "rank ", rank, ": backend nccl: ", sharing, " ranks of this job share GPU ",
                 gpu_description, " (", gpu_uuid, "), and NCCL runs one rank per GPU. Start at most one process "
                 "per GPU (--nproc-per-node no more than the GPUs of a node), give each rank its own "
                 "(strategy.device: cuda is cuda:LOCAL_RANK), or use backend gloo, which takes CUDA tensors "
                 "from ranks that share a GPU");
}

}  // namespace lockstep
