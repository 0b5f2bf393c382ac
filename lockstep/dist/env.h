// Where this process sits in a distributed job, read from the environment
// that a launcher leaves behind: torchrun / `lockstep run` ("pytorch"), SLURM's
// srun ("slurm"), Open MPI's mpirun ("mpi"), or nothing ("none"). "auto" picks
// the first that applies in that order.
//
//   lockstep::DistEnv env = lockstep::detect_dist_env("slurm");
//   // env.rank, env.world_size, env.local_rank, env.master_addr, ...
//
// Errors name the missing or invalid variable. SLURM_NODELIST is expanded by
// lockstep itself (no `scontrol`): "node[01-03,07],gpu5" has four hosts.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace lockstep {

struct DistEnv {
  std::string launcher = "none";  // the launcher the values came from
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;   // -1 when the launcher does not say
  int node_rank = -1;         // GROUP_RANK / SLURM_NODEID; -1 when unknown
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's agent hosts the store: connect as a client under
  // "/worker/attempt_<restart_count>".
  bool use_agent_store = false;
  int restart_count = 0;
};

using Environment = std::map<std::string, std::string>;

// The process environment as a map.
Environment current_environment();

DistEnv detect_dist_env(const std::string& launcher = "auto");
DistEnv detect_dist_env(const std::string& launcher, const Environment& env);

// "node[01-03,07],gpu5" -> {node01, node02, node03, node07, gpu5}. Several
// bracket groups in one name expand as a product ("r[1-2]n[1-2]" -> r1n1,
// r1n2, r2n1, r2n2); zero padding follows the range's first bound.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

// SLURM_TASKS_PER_NODE "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks);

}  // namespace lockstep
