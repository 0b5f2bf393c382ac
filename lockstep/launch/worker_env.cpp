// The torchrun worker environment (see launcher.h).
#include "lockstep/core/error.h"
#include "lockstep/launch/launcher.h"

namespace lockstep {

void validate_launch_options(const LaunchOptions& options) {
  LOCKSTEP_CHECK(!options.command().empty(), "lockstep run: no command given (usage: lockstep run --nproc-per-node N "
                 "-- CMD ARGS...)");
  LOCKSTEP_CHECK(options.nproc_per_node() >= 1, "lockstep run: --nproc-per-node must be at least 1, got ",
                 options.nproc_per_node());
  LOCKSTEP_CHECK(options.max_restarts() >= 0, "lockstep run: --max-restarts must not be negative, got ",
                 options.max_restarts());
  LOCKSTEP_CHECK(options.monitor_interval() > 0, "lockstep run: --monitor-interval must be positive, got ",
                 options.monitor_interval());
  LOCKSTEP_CHECK(options.kill_grace() >= 0, "lockstep run: the kill grace period must not be negative");
  LOCKSTEP_CHECK(options.signal_grace() >= 0, "lockstep run: --signal-grace must not be negative, got ",
                 options.signal_grace());
  LOCKSTEP_CHECK(options.join_timeout() > 0, "lockstep run: --join-timeout must be positive, got ",
                 options.join_timeout());
  LOCKSTEP_CHECK(options.rdzv_backend() == "c10d" || options.rdzv_backend() == "static" ||
                 options.rdzv_backend() == "etcd", "lockstep run: --rdzv-backend '", options.rdzv_backend(),
                 "' is none of c10d, static and etcd");
  if (options.standalone()) return;
  LOCKSTEP_CHECK(options.nnodes() >= 1, "lockstep run: --nnodes must be at least 1, got ", options.nnodes());
  LOCKSTEP_CHECK(options.min_nodes() >= 0 && options.min_nodes() <= options.nnodes(), "lockstep run: --nnodes ",
                 options.min_nodes(), ":", options.nnodes(), " needs 1 <= MIN <= MAX");
  LOCKSTEP_CHECK(options.last_call_timeout() >= 0, "lockstep run: last_call_timeout must not be negative, got ",
                 options.last_call_timeout());
  LOCKSTEP_CHECK(options.node_rank() >= 0 && options.node_rank() < options.nnodes(), "lockstep run: --node-rank ",
                 options.node_rank(), " is not in [0, ", options.nnodes(), ") (--nnodes)");
  LOCKSTEP_CHECK(options.master_port() >= 1 && options.master_port() <= 65535, "lockstep run: --master-port ",
                 options.master_port(), " is not a TCP port (1-65535)");
  LOCKSTEP_CHECK(!options.master_addr().empty(), "lockstep run: --master-addr is empty");
}

NodePlacement NodePlacement::fixed(const LaunchOptions& options, int restart_count) {
  NodePlacement placement;
  placement.nnodes = options.standalone() ? 1 : options.nnodes();
  placement.node_rank = options.standalone() ? 0 : options.node_rank();
  placement.restart_count = restart_count;
  return placement;
}

Environment build_worker_env(const LaunchOptions& options, int local_rank, int restart_count, int master_port,
                             const std::string& run_id, const Environment& base) {
  return build_worker_env(options, NodePlacement::fixed(options, restart_count), local_rank, master_port, run_id,
                          base);
}

Environment build_worker_env(const LaunchOptions& options, const NodePlacement& placement, int local_rank,
                             int master_port, const std::string& run_id, const Environment& base) {
  const int nproc = options.nproc_per_node();
  const int nnodes = placement.nnodes;
  const int node_rank = placement.node_rank;
  const int restart_count = placement.restart_count;
  const int rank = node_rank * nproc + local_rank;
  const std::string world_size = std::to_string(nnodes * nproc);
  Environment env = base;
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["RANK"] = std::to_string(rank);
  env["GROUP_RANK"] = std::to_string(node_rank);
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_NAME"] = "default";
  env["LOCAL_WORLD_SIZE"] = std::to_string(nproc);
  env["WORLD_SIZE"] = world_size;
  env["GROUP_WORLD_SIZE"] = std::to_string(nnodes);
  env["ROLE_WORLD_SIZE"] = world_size;
  if (!placement.master_addr.empty()) {
    env["MASTER_ADDR"] = placement.master_addr;
    env["MASTER_PORT"] = std::to_string(placement.master_port);
  } else {
    env["MASTER_ADDR"] = options.standalone() ? "127.0.0.1" : options.master_addr();
    env["MASTER_PORT"] = std::to_string(master_port);
  }
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.max_restarts());
  env["TORCHELASTIC_RUN_ID"] = run_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  if (placement.round >= 0) {
    env["LOCKSTEP_RDZV_ROUND"] = std::to_string(placement.round);
  } else {
    env.erase("LOCKSTEP_RDZV_ROUND");
  }
  if (!options.socket_ifname().empty()) env["GLOO_SOCKET_IFNAME"] = options.socket_ifname();
  // Several workers on one machine would each start one OpenMP thread per core.
  if (nproc > 1 && (base.find("OMP_NUM_THREADS") == base.end() || base.at("OMP_NUM_THREADS").empty())) {
    env["OMP_NUM_THREADS"] = "1";
  }
  return env;
}

}  // namespace lockstep
