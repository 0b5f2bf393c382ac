#include "lockstep/comm/init.h"

#include "lockstep/comm/env.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "lockstep/compat/cuda.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/open_files.h"
#include "lockstep/comm/comm.h"
#include "lockstep/comm/gpu_claim.h"
#include "lockstep/comm/internal/store_views.h"
#include "lockstep/comm/job_identity.h"
#include "lockstep/comm/mpi_meeting.h"
#include "lockstep/comm/network.h"
#include "lockstep/comm/rendezvous.h"

namespace lockstep {

namespace {

struct DistState {
  std::shared_ptr<ProcessGroup> world;
  std::shared_ptr<ProcessGroup> local;
  DistEnv env;
  int generation = 0;  // how many times this process initialised; keys of each run stay apart
};

DistState& state() {
  // Never destroyed: Gloo's threads must not be joined during static destruction.
  static DistState* instance = new DistState();
  return *instance;
}

std::string host_name() {
  char buffer[256] = {0};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "localhost";
  return buffer;
}

// With LOCKSTEP_JOB_TOKEN set, the part of the store only this job reaches
// (lockstep/comm/job_identity.h, Note [The store's job token]); without it, the whole store.
c10::intrusive_ptr<compat::C10dStore> job_view(const c10::intrusive_ptr<compat::C10dStore>& store, bool host,
                                               int rank, const std::string& where, std::chrono::milliseconds timeout) {
  const char* token = std::getenv("LOCKSTEP_JOB_TOKEN");
  if (token == nullptr || *token == '\0') return store;
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  JobIdentity job{run_id != nullptr ? run_id : "", token};
  if (host) return publish_job(store, job);
  try {
    return join_job(store, job, timeout, where);
  } catch (const Error& error) {
    LOCKSTEP_FAIL("rank ", rank, ": ", error.what());
  }
}

c10::intrusive_ptr<compat::C10dStore> connect_store(const InitOptions& options) {
  if (options.store()) return options.store();
  if (options.world_size() == 1) return compat::make_hash_store();
  compat::TcpStoreSpec spec;
  spec.host = options.master_addr();
  spec.port = options.master_port();
  spec.is_server = options.rank() == 0;
  spec.num_workers = options.world_size();
  spec.timeout = options.timeout();
  c10::intrusive_ptr<compat::C10dStore> store;
  try {
    store = compat::make_tcp_store(spec).first;
  } catch (const std::exception&) {
    if (spec.is_server) {
      rethrow_with_context(str_cat("rank 0: cannot host the rendezvous store on port ", spec.port,
                                   " (is another job using MASTER_PORT=", spec.port, "?)"));
    }
    rethrow_with_context(str_cat("rank ", options.rank(), ": cannot reach the rendezvous store at ", spec.host, ":",
                                 spec.port, " within ", detail::format_duration(spec.timeout),
                                 " (is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?)"));
  }
  return job_view(store, spec.is_server, options.rank(), str_cat(spec.host, ":", spec.port), options.timeout());
}

// Groups the ranks by machine and builds this rank's node group. A launcher
// that does not say which node a rank is on (mpirun's environment names no
// node) has the machines told apart by host name, as MPI itself does, and
// `node_rank` becomes the node's place among the nodes by their first rank.
std::shared_ptr<ProcessGroup> make_local_group(const std::shared_ptr<ProcessGroup>& world, int& node_rank) {
  if (world->size() == 1) return world;
  std::string key = node_rank >= 0 ? str_cat("node", node_rank) : host_name();
  auto keys = all_gather_object(key, world);
  std::vector<int> members;
  std::vector<std::string> nodes_in_order;
  for (int r = 0; r < world->size(); ++r) {
    const std::string& other = keys[static_cast<size_t>(r)];
    if (other == key) members.push_back(r);
    if (std::find(nodes_in_order.begin(), nodes_in_order.end(), other) == nodes_in_order.end()) {
      nodes_in_order.push_back(other);
    }
  }
  if (node_rank < 0) {
    node_rank = static_cast<int>(std::find(nodes_in_order.begin(), nodes_in_order.end(), key) - nodes_in_order.begin());
  }
  logger().info("rank {} of {}: node group '{}' = ranks {}", world->rank(), world->size(), key, format_ranks(members));
  if (static_cast<int>(members.size()) == world->size()) return world;
  return world->new_group(members, "local/" + key);
}

// The options a world group starts from, checked before anything is reached.
void check_init_options(const InitOptions& options) {
  LOCKSTEP_CHECK(options.world_size() >= 1, "init_process_group: world_size must be at least 1, got ",
                 options.world_size());
  LOCKSTEP_CHECK(options.rank() >= 0 && options.rank() < options.world_size(), "init_process_group: rank ",
                 options.rank(), " is not in [0, ", options.world_size(), ")");
  LOCKSTEP_CHECK(options.backend() == "gloo" || options.backend() == "nccl", "init_process_group: unknown backend '",
                 options.backend(), "' (expected gloo or nccl)");
  LOCKSTEP_CHECK(options.timeout().count() > 0, "init_process_group: the timeout must be positive");
  LOCKSTEP_CHECK(options.master_port() >= 0 && options.master_port() <= 65535, "init_process_group: master_port ",
                 options.master_port(), " is not a TCP port");
  if (options.backend() == "nccl") {
    LOCKSTEP_CHECK(compat::has_nccl(), "init_process_group: backend 'nccl' needs a libtorch built with CUDA and "
                   "NCCL; this one (", compat::torch_version(), ") is not; use backend 'gloo'");
  }
}

// Room for what this rank opens next (Note [Raising the open-file limit]
// in core/open_files.cpp): its store connection, or the whole job's where
// rank 0 hosts the store; one socket per peer in Gloo's mesh; NCCL's
// bootstrap, which connects every rank to rank 0. Counted before the store
// is reached, so that a rank without room fails at once rather than after
// waiting for the others; make_gloo_mesh counts each mesh again when it is
// built (subgroups' too).
void make_room_for_the_job(const InitOptions& options) {
  const int rank = options.rank(), size = options.world_size();
  const bool hosts_store = !options.store() && rank == 0;
  const long sockets = compat::tcp_store_connections_per_client() * (hosts_store ? size + 1 : 1) + (size - 1) +
                       (options.backend() == "nccl" ? size : 0);
  const OpenFilesRoom room =
      make_room_for_open_files(sockets, str_cat("rank ", rank),
                               hosts_store ? str_cat("hosting the store of a job of ", size, " ranks and joining it")
                                           : str_cat("joining a job of ", size, " ranks"));
  if (room.raised()) logger().info("rank {} of {}: {}", rank, size, room.describe());
}

// The world group's parts before it connects: its ranks, timeout and stores
// under `root`, and the address its Gloo transport binds.
ProcessGroup::Parts world_group_parts(const InitOptions& options, const DistEnv& env,
                                      const c10::intrusive_ptr<compat::C10dStore>& root) {
  const int rank = options.rank(), size = options.world_size();
  ProcessGroup::Parts parts;
  parts.name = "world";
  parts.rank = rank;
  for (int r = 0; r < size; ++r) parts.global_ranks.push_back(r);
  parts.timeout = options.timeout();
  parts.root_store = root;
  parts.store = compat::make_prefix_store("group/world/", root);
  parts.gloo_device = gloo_device_for(gloo_socket_interfaces(), options.master_addr(), options.master_port(), size);
  logger().info("rank {} of {}: Gloo transport bound to {}", rank, size, describe(parts.gloo_device));
  if (compat::gloo_capabilities().listens_per_pair && env.local_rank == 0) {
    // Note [Ports for a mesh on one host] in comm/network.cpp.
    const std::optional<PortRange> range = ephemeral_port_range();
    const std::string warning = range ? mesh_port_warning(env.local_world_size, size, *range) : "";
    if (!warning.empty()) logger().warn("rank {} of {}: {}", rank, size, warning);
  }
  return parts;
}

// The world's connections, once every rank has met: Gloo's mesh, and NCCL's
// communicator (one rank per GPU) where the backend is nccl.
void connect_world(ProcessGroup::Parts& parts, const InitOptions& options) {
  const int rank = options.rank(), size = options.world_size();
  try {
    parts.gloo = make_gloo_mesh(compat::make_prefix_store("gloo/", parts.store), rank, size, options.timeout(),
                                parts.gloo_device);
    if (options.backend() == "nccl") {
      const int device = compat::current_cuda_device();
      LOCKSTEP_CHECK(device >= 0, "rank ", rank, ": backend nccl needs a GPU, and this process sees none");
      const auto gpu = compat::cuda_device_identity(device);
      check_one_rank_per_gpu(compat::make_prefix_store("nccl_gpus/", parts.store), rank, size, gpu.uuid,
                             str_cat("cuda:", device, " (", gpu.name, ")"), options.timeout());
      parts.nccl = compat::make_nccl(compat::make_prefix_store("nccl/", parts.store), rank, size, options.timeout());
    }
  } catch (const std::exception&) {
    rethrow_with_context(str_cat("rank ", rank, ": creating the world process group"));
  }
}

}  // namespace

namespace {
std::atomic<int64_t>& process_default_timeout_ms() {
  static std::atomic<int64_t> milliseconds{30LL * 60 * 1000};  // torch's default
  return milliseconds;
}
}  // namespace

void set_default_timeout(std::chrono::milliseconds timeout) {
  LOCKSTEP_CHECK(timeout.count() > 0, "set_default_timeout: the timeout must be positive, got ", timeout.count(), " ms");
  process_default_timeout_ms() = timeout.count();
}

std::chrono::milliseconds default_timeout() {
  const char* text = std::getenv("LOCKSTEP_TIMEOUT_S");
  if (text != nullptr && *text != '\0') {
    char* end = nullptr;
    double seconds = std::strtod(text, &end);
    LOCKSTEP_CHECK(end != text && *end == '\0' && seconds > 0, "LOCKSTEP_TIMEOUT_S='", text,
                   "' is not a positive number of seconds");
    return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  }
  return std::chrono::milliseconds(process_default_timeout_ms().load());
}

static std::shared_ptr<ProcessGroup> init_with_env(const InitOptions& options, DistEnv env);

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  DistEnv env;
  env.launcher = options.launcher();
  env.rank = options.rank();
  env.world_size = options.world_size();
  env.local_rank = options.local_rank();
  env.local_world_size = options.local_world_size();
  env.node_rank = options.node_rank();
  env.master_addr = options.master_addr();
  env.master_port = options.master_port();
  return init_with_env(options, env);
}

static std::shared_ptr<ProcessGroup> init_with_env(const InitOptions& options, DistEnv env) {
  auto& s = state();
  LOCKSTEP_CHECK(!s.world, "init_process_group: already initialised (rank ", s.world->rank(),
                 " of ", s.world->size(), "); call destroy_process_group() first");
  check_init_options(options);
  const int rank = options.rank(), size = options.world_size();
  const auto started = std::chrono::steady_clock::now();
  // No other thread uses the store before the world exists: the node groups
  // built below may wait on it in one call (BlockingStoreWaits).
  BlockingStoreWaits blocking_waits;
  if (size > 1) make_room_for_the_job(options);
  // Every operation this process makes on the job's store is counted: the
  // figure that shows Gloo's address exchange costs each rank a constant.
  CountedStore store = make_counting_store(connect_store(options));
  // Each initialisation gets fresh keys, even when an earlier one failed halfway.
  auto root = compat::make_prefix_store(str_cat("lockstep/", s.generation++, "/"), store.store);

  ProcessGroup::Parts parts = world_group_parts(options, env, root);
  rendezvous(parts.store, "world", rank, size, options.timeout(),
             str_cat("check that the world size (", size, ") matches the number of workers started"));
  const auto met = std::chrono::steady_clock::now();
  connect_world(parts, options);
  const auto connected = std::chrono::steady_clock::now();
  s.world = std::make_shared<ProcessGroup>(std::move(parts));
  try {
    int node_rank = options.node_rank();
    s.local = make_local_group(s.world, node_rank);
    env.node_rank = node_rank;
  } catch (...) {
    s.world.reset();
    throw;
  }
  s.env = std::move(env);
  // Where a large job's start-up goes: meeting the others, connecting to
  // them (Gloo's mesh; NCCL's too), and the node groups (one all-gather).
  const auto seconds = [](auto from, auto to) { return std::chrono::duration<double>(to - from).count(); };
  logger().info("rank {} of {}: world group ready after {} store operations, {} bytes read; {:.2f} s to meet, {:.2f} s "
                "to connect, {:.2f} s for the node groups",
                rank, size, store.operations->load(), store.bytes_read->load(), seconds(started, met),
                seconds(met, connected), seconds(connected, std::chrono::steady_clock::now()));
  return s.world;
}

std::shared_ptr<ProcessGroup> init_from_env(const std::string& launcher, const std::string& backend,
                                            std::chrono::milliseconds timeout) {
  DistEnv env = detect_dist_env(launcher);
  if (env.meet_over_mpi) {
    const MpiMeeting meeting = meet_over_mpi_world("launcher 'mpi' without MASTER_ADDR");
    LOCKSTEP_CHECK(meeting.rank == env.rank && meeting.size == env.world_size, "launcher 'mpi': MPI_COMM_WORLD says rank ",
                   meeting.rank, " of ", meeting.size, ", the environment rank ", env.rank, " of ", env.world_size);
    env.master_addr = meeting.master_addr;
    env.master_port = meeting.master_port;
    env.node_rank = meeting.node_index;
    env.local_world_size = meeting.local_size;
    logger().info("rank {} of {}: found the others over MPI_COMM_WORLD (no MASTER_ADDR): rank 0 listens at {}:{}",
                  env.rank, env.world_size, env.master_addr, env.master_port);
  }
  InitOptions options;
  options.rank(env.rank).world_size(env.world_size).master_addr(env.master_addr).master_port(env.master_port)
      .backend(backend).timeout(timeout).node_rank(env.node_rank);
  if (env.use_agent_store) {
    compat::TcpStoreSpec spec;
    spec.host = env.master_addr;
    spec.port = env.master_port;
    spec.timeout = timeout;
    spec.num_workers = env.world_size;
    c10::intrusive_ptr<compat::C10dStore> agent;
    try {
      agent = compat::make_tcp_store(spec).first;
    } catch (const std::exception&) {
      rethrow_with_context(str_cat("rank ", env.rank, ": cannot reach the launcher's store at ", spec.host, ":",
                                   spec.port, " (TORCHELASTIC_USE_AGENT_STORE=True)"));
    }
    auto job = job_view(agent, /*host=*/false, env.rank, str_cat(spec.host, ":", spec.port), timeout);
    options.store(compat::make_prefix_store(str_cat("/worker/attempt_", env.attempt), job));
  }
  return init_with_env(options, env);
}

bool is_initialized() { return state().world != nullptr; }

std::shared_ptr<ProcessGroup> world() {
  auto& s = state();
  LOCKSTEP_CHECK(s.world, "the distributed process group is not initialised; call lockstep::init_from_env() or "
                 "lockstep::init_process_group() first");
  return s.world;
}

std::shared_ptr<ProcessGroup> local_group() {
  auto& s = state();
  LOCKSTEP_CHECK(s.local, "the distributed process group is not initialised; call lockstep::init_from_env() or "
                 "lockstep::init_process_group() first");
  return s.local;
}

const DistEnv& dist_env() { return state().env; }

void destroy_process_group() {
  auto& s = state();
  s.local.reset();
  s.world.reset();
  s.env = DistEnv();
}

}  // namespace lockstep
