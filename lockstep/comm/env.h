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
// MASTER_PORT defaults to 29500, except under SLURM: 15000 + the last four
// digits of SLURM_JOB_ID, so that jobs sharing a node do not collide (Note [A
// port per SLURM job] in env.cpp).
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
  // "/worker/attempt_<attempt>".
  bool use_agent_store = false;
  int restart_count = 0;
  // job_attempt() below: the restart, or an elastic job's rendezvous round.
  int attempt = 0;
  // Under mpirun without MASTER_ADDR, in a build with MPI: rank 0's address
  // and port come over MPI_COMM_WORLD at init (comm/mpi_meeting.h).
  bool meet_over_mpi = false;
  // The launcher the config named, when it left no variable at all behind
  // (the process was started by hand): the job runs as one process.
  std::string absent_launcher;
};

using Environment = std::map<std::string, std::string>;

// The process environment as a map.
Environment current_environment();

// A launcher named explicitly ("pytorch", "slurm", "mpi") that left none of
// its variables behind means a process started by hand: it runs as a world of
// one (launcher "none", absent_launcher set). Some but not all variables is an
// error naming the missing one.
DistEnv detect_dist_env(const std::string& launcher = "auto");
DistEnv detect_dist_env(const std::string& launcher, const Environment& env);

// Which restart of the job this process belongs to: TORCHELASTIC_RESTART_COUNT
// (torchrun, `lockstep run`), 0 for the first attempt or without a launcher.
// A value that is not a non-negative number is an error naming it.
int restart_count(const Environment& env = current_environment());

// Which start of the workers this is: an elastic job's rendezvous round
// (LOCKSTEP_RDZV_ROUND, from `lockstep run --nnodes MIN:MAX`: a new round
// also when a node joins), else restart_count(); plus the times SLURM
// requeued the job (SLURM_RESTART_COUNT). 0 only for the first.
int job_attempt(const Environment& env = current_environment());

// The network interfaces GLOO_SOCKET_IFNAME names (comma separated; empty
// when unset), for comm/network.h.
std::vector<std::string> gloo_socket_interfaces(const Environment& env = current_environment());

// How many processes the launcher that started this one (if any) started in
// all: WORLD_SIZE (torchrun, `lockstep run`), OMPI_COMM_WORLD_SIZE (mpirun),
// SLURM_STEP_NUM_TASKS (an srun step); 1 when none is set or parses. A
// process that trains alone checks it, so that N copies never silently train
// N independent models into one work dir.
int launched_world_size(const Environment& env);

// "node[01-03,07],gpu5" -> {node01, node02, node03, node07, gpu5}. Several
// bracket groups in one name expand as a product ("r[1-2]n[1-2]" -> r1n1,
// r1n2, r2n1, r2n2); zero padding follows the range's first bound.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

// SLURM_TASKS_PER_NODE "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks);

}  // namespace lockstep
