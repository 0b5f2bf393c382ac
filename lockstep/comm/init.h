// Starting and stopping the distributed job in this process: the default
// ("world") process group and the per-node ("local") group.
//
// From a launcher's environment (torchrun / `lockstep run`, SLURM, Open MPI):
//
//   lockstep::init_from_env();                 // launcher "auto", backend "gloo"
//   auto world = lockstep::world();
//   auto node = lockstep::local_group();       // the ranks on this machine
//   ...
//   lockstep::destroy_process_group();
//
// Explicitly, for library users:
//
//   lockstep::init_process_group(lockstep::InitOptions().rank(r).world_size(4)
//                                    .master_addr("10.0.0.1").master_port(29500)
//                                    .timeout(std::chrono::minutes(5)));
//
// Rank 0 hosts the rendezvous TCPStore unless a store is given (torchrun's
// agent store). Every rank then checks in; a world that never fills up ends in
// a TimeoutError saying how many ranks arrived and which are missing. All
// waits use the group timeout: 30 minutes by default, or LOCKSTEP_TIMEOUT_S.
#pragma once

#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/compat/c10d.h"
#include "lockstep/comm/env.h"
#include "lockstep/comm/process_group.h"

namespace lockstep {

// 30 minutes (torch's default), or LOCKSTEP_TIMEOUT_S seconds when set, or
// what set_default_timeout() made it for this process (the variable still wins).
std::chrono::milliseconds default_timeout();
// The default of groups created from now on in this process (StepTrainer
// makes it 5 minutes); LOCKSTEP_TIMEOUT_S still overrides it.
void set_default_timeout(std::chrono::milliseconds timeout);

struct InitOptions {
  TORCH_ARG(int, rank) = 0;
  TORCH_ARG(int, world_size) = 1;
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int, master_port) = 29500;
  // A store to rendezvous through instead of master_addr:master_port.
  TORCH_ARG(c10::intrusive_ptr<compat::C10dStore>, store);
  // "gloo", or "nccl" (CUDA tensors through NCCL, CPU tensors through Gloo).
  TORCH_ARG(std::string, backend) = "gloo";
  TORCH_ARG(std::chrono::milliseconds, timeout) = default_timeout();
  // Which machine this rank is on (GROUP_RANK); -1 groups ranks by host name.
  TORCH_ARG(int, node_rank) = -1;
  // This rank among those of its machine, and how many they are (LOCAL_RANK,
  // LOCAL_WORLD_SIZE); -1 when unknown. The local rank picks the GPU.
  TORCH_ARG(int, local_rank) = -1;
  TORCH_ARG(int, local_world_size) = -1;
  // Where the ranks came from, for messages ("mpi", ...).
  TORCH_ARG(std::string, launcher) = "explicit";
};

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options);

// Reads detect_dist_env(launcher) and initialises from it. Under torchrun's
// agent store the ranks connect as clients with the per-attempt prefix.
std::shared_ptr<ProcessGroup> init_from_env(const std::string& launcher = "auto", const std::string& backend = "gloo",
                                            std::chrono::milliseconds timeout = default_timeout());

bool is_initialized();
// The default group; throws when not initialised.
std::shared_ptr<ProcessGroup> world();
// The ranks that share this rank's machine (the world itself on one machine).
std::shared_ptr<ProcessGroup> local_group();
// The environment init_from_env read (a world of one after init_process_group).
const DistEnv& dist_env();
// Drops the groups; init_* may be called again afterwards.
void destroy_process_group();

}  // namespace lockstep
