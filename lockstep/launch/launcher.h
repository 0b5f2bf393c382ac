// The `lockstep run` launcher as a library: start N copies of a command on
// this machine with torchrun's worker environment, supervise them, and stop
// or restart all of them together.
//
//   int code = lockstep::launch(lockstep::LaunchOptions()
//                                   .nproc_per_node(2)
//                                   .standalone(true)
//                                   .command({"./train", "cfg.yaml"}));
//
// What it does, like torchrun --no-python:
//   - each worker gets LOCAL_RANK, RANK, GROUP_RANK, ROLE_RANK, LOCAL_WORLD_SIZE,
//     WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
//     TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID and OMP_NUM_THREADS=1
//     (when unset and N > 1), and GLOO_SOCKET_IFNAME with --socket-ifname;
//   - node 0's launcher hosts the rendezvous TCPStore (the "agent store":
//     TORCHELASTIC_USE_AGENT_STORE=True, workers connect as clients under
//     "/worker/attempt_<restart>"); --standalone lets the OS pick its port;
//   - every line a worker prints is prefixed with "[rank<R>]: ";
//   - node 0 publishes the job's identity (run id, job token) on the store;
//     other nodes' launchers and every worker check it, and a process with
//     another run id or token is refused (lockstep/comm/job_identity.h);
//   - SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are forwarded to the
//     workers; after one of the first three they get signal_grace seconds
//     before SIGKILL. Workers that save and exit with kExitRequeue (75, a
//     preempted `lockstep train`) are not restarted: the launcher exits with
//     75 too, for the scheduler to start the job again;
//   - when a worker fails, the others get SIGTERM, then SIGKILL after
//     kill_grace seconds; with restarts left every worker starts again with
//     TORCHELASTIC_RESTART_COUNT + 1, otherwise launch() returns the failed
//     worker's exit code (128 + signal for a signal); on several nodes the
//     launchers restart together: a node whose workers failed announces the
//     next round on node 0's store, the others stop their workers, and all
//     wait for each other before starting the new attempt (--join-timeout);
//   - each worker runs in its own process group, which is killed when the
//     worker ends, so nothing it spawned is left behind;
//   - elastic jobs (min_nodes > 0, `--nnodes MIN:MAX`): the nodes meet in
//     rendezvous rounds (lockstep/launch/elastic_rendezvous.h) hosted by the
//     launcher at master_addr. Each round admits the nodes that arrive within
//     the last call once there are MIN, numbers them, and starts their
//     workers; a node that fails or a new node (while fewer than MAX run)
//     starts the next round. Workers get LOCKSTEP_RDZV_ROUND, and
//     TORCHELASTIC_RESTART_COUNT counts the rounds that followed a failure.
//
//   // One of up to 3 machines; the job runs while 2 are left:
//   lockstep::launch(lockstep::LaunchOptions().min_nodes(2).nnodes(3).master_addr("10.0.0.1")
//                        .max_restarts(3).command({"./train", "cfg.yaml"}));
#pragma once

#include <torch/arg.h>

#include <string>
#include <vector>

#include "lockstep/comm/env.h"
#include "lockstep/launch/etcd_client.h"

namespace lockstep {

struct LaunchOptions {
  TORCH_ARG(int, nproc_per_node) = 1;
  // Fixed jobs: the number of machines. Elastic jobs: the most machines.
  TORCH_ARG(int, nnodes) = 1;
  // Elastic jobs: the fewest machines the job runs with (`--nnodes MIN:MAX`);
  // 0: a fixed job of nnodes machines, numbered by node_rank.
  TORCH_ARG(int, min_nodes) = 0;
  TORCH_ARG(int, node_rank) = 0;
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int, master_port) = 29500;
  // One machine, loopback, a free port: master_addr/port/nnodes are ignored.
  TORCH_ARG(bool, standalone) = false;
  TORCH_ARG(int, max_restarts) = 0;
  // Multi-node restarts: seconds a node's launcher waits for the others to
  // join a restart before it gives up (lockstep/launch/restart_rounds.h).
  TORCH_ARG(double, join_timeout) = 600;
  // Elastic jobs: seconds a round stays open for more nodes once MIN have
  // arrived (torchrun's rdzv-conf last_call_timeout).
  TORCH_ARG(double, last_call_timeout) = 30;
  // How often (seconds) worker states are checked when nothing else happens.
  TORCH_ARG(double, monitor_interval) = 0.1;
  // Seconds between SIGTERM and SIGKILL when stopping workers after one failed.
  TORCH_ARG(double, kill_grace) = 3.0;
  // Seconds the workers get, after a SIGINT/SIGTERM/SIGHUP the launcher
  // forwards (or after one of them exits with kExitRequeue), to save and exit
  // before they are killed (torchrun gives 30).
  TORCH_ARG(double, signal_grace) = 60.0;
  TORCH_ARG(std::string, run_id) = "";
  // The secret every node of the job shares (see lockstep/comm/job_identity.h);
  // empty: $LOCKSTEP_JOB_TOKEN, else a random one -- which only a single-node
  // job may use. Workers get it as LOCKSTEP_JOB_TOKEN.
  TORCH_ARG(std::string, job_token) = "";
  // The network interface(s) the workers' Gloo transport binds to, comma
  // separated; exported as GLOO_SOCKET_IFNAME. Empty: $GLOO_SOCKET_IFNAME if
  // set, else the interface that routes to the master (lockstep/comm/network.h).
  TORCH_ARG(std::string, socket_ifname) = "";
  // Elastic jobs: where the rounds live. "c10d": on the store of the
  // launcher at master_addr (torchrun's default); "etcd": on an etcd cluster
  // (lockstep/launch/etcd_rendezvous.h), so that any node may die.
  TORCH_ARG(std::string, rdzv_backend) = "c10d";
  // --rdzv-backend etcd: the cluster (endpoints, TLS, user), the lease that
  // tells the others this node is alive, and the address other nodes reach
  // this one at (--local-addr; empty: the one it reaches etcd from).
  TORCH_ARG(EtcdOptions, etcd);
  TORCH_ARG(double, lease_ttl) = 10;
  TORCH_ARG(std::string, local_addr) = "";
  // Prefix each output line with "[rank<R>]: ".
  TORCH_ARG(bool, prefix_output) = true;
  TORCH_ARG(std::vector<std::string>, command);


 public:
  bool elastic() const { return min_nodes() > 0 && !standalone(); }
};

// Where one node's workers stand in the job for one attempt.
struct NodePlacement {
  int node_rank = 0;
  int nnodes = 1;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: restarts after failures so far
  int round = -1;         // elastic jobs: the rendezvous round (LOCKSTEP_RDZV_ROUND); -1: not elastic
  std::string master_addr;  // where the workers meet, when not master_addr and the port given (etcd rounds)
  int master_port = 0;

  // A fixed job's placement: --node-rank of --nnodes (one node in standalone mode).
  static NodePlacement fixed(const LaunchOptions& options, int restart_count);
};

// The environment of worker `local_rank`: `base` plus torchrun's variables.
// `master_port` is the port actually used (chosen in standalone mode).
Environment build_worker_env(const LaunchOptions& options, const NodePlacement& placement, int local_rank,
                             int master_port, const std::string& run_id, const Environment& base);
// The same for a fixed job.
Environment build_worker_env(const LaunchOptions& options, int local_rank, int restart_count, int master_port,
                             const std::string& run_id, const Environment& base);

// Checks options (ranges, a command to run); throws lockstep::Error.
void validate_launch_options(const LaunchOptions& options);

// Runs the job to completion and returns the exit code for the launcher.
int launch(const LaunchOptions& options);

}  // namespace lockstep
