// lockstep_trainer_create_mpi (lockstep/lockstep_mpi.h): the process group
// from an MPI communicator. Compiled to something only with MPI
// (LOCKSTEP_WITH_MPI, set by CMake when it finds MPI).
#if defined(LOCKSTEP_WITH_MPI)

#include "lockstep/lockstep_mpi.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "lockstep/capi/capi_internal.h"
#include "lockstep/core/error.h"
#include "lockstep/dist/init.h"

namespace lockstep {
namespace {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw DistributedError(str_cat("lockstep_trainer_create_mpi: ", call, " failed: ", std::string(text, length)));
}

// A TCP port free a moment ago, on this host.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  LOCKSTEP_CHECK(fd >= 0, "lockstep_trainer_create_mpi: cannot open a socket: ", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  LOCKSTEP_CHECK(ok, "lockstep_trainer_create_mpi: cannot find a free port: ", std::strerror(errno));
  return ntohs(address.sin_port);
}

// This host's first IPv4 address on an interface that is up and not loopback.
std::string host_address() {
  ifaddrs* all = nullptr;
  LOCKSTEP_CHECK(::getifaddrs(&all) == 0, "lockstep_trainer_create_mpi: cannot list network interfaces: ",
                 std::strerror(errno));
  std::string found;
  for (ifaddrs* entry = all; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN];
    const auto* ip = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (::inet_ntop(AF_INET, &ip->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  ::freeifaddrs(all);
  LOCKSTEP_CHECK(!found.empty(), "lockstep_trainer_create_mpi: rank 0 has no network interface other ranks could "
                                 "reach (no IPv4 address that is up and not loopback)");
  return found;
}

// Note [A process group from an MPI communicator]
// lockstep's collectives are c10d's (Gloo, NCCL), not MPI's: MPI only tells
// each rank who it is and where rank 0 listens. Rank 0 picks a free port and
// its address (loopback when the communicator fits on one node, else its first
// reachable IPv4 address) and broadcasts both; the node-local split gives the
// local rank (the GPU) and the node's index. Then the ranks meet through
// lockstep's own store as under any launcher.
// Returns false when the process group of an earlier trainer over the same
// ranks is still there (it is used again).
bool init_from_communicator(MPI_Comm comm) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  LOCKSTEP_CHECK(initialized, "lockstep_trainer_create_mpi: call MPI_Init before creating a trainer from a communicator");
  LOCKSTEP_CHECK(comm != MPI_COMM_NULL, "lockstep_trainer_create_mpi: the communicator is MPI_COMM_NULL");
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  if (is_initialized()) {
    LOCKSTEP_CHECK(world()->rank() == rank && world()->size() == size, "lockstep_trainer_create_mpi: this process "
                   "already has a lockstep process group of ", world()->size(), " ranks (it is rank ", world()->rank(),
                   "), made for another communicator of ", size, " ranks; one group per process");
    return false;
  }
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int local_rank = 0, local_size = 1;
  check_mpi(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(node, &local_size), "MPI_Comm_size");
  // The node's index: its first rank's place among the nodes' first ranks.
  MPI_Comm leaders;
  check_mpi(MPI_Comm_split(comm, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders), "MPI_Comm_split");
  int node_index = 0;
  if (leaders != MPI_COMM_NULL) {
    check_mpi(MPI_Comm_rank(leaders, &node_index), "MPI_Comm_rank");
    MPI_Comm_free(&leaders);
  }
  check_mpi(MPI_Bcast(&node_index, 1, MPI_INT, 0, node), "MPI_Bcast");
  MPI_Comm_free(&node);

  char address[64] = {0};
  int port = 0;
  std::string failure;
  if (rank == 0) {
    try {
      const std::string chosen = local_size == size ? std::string("127.0.0.1") : host_address();
      std::strncpy(address, chosen.c_str(), sizeof(address) - 1);
      port = free_port();
    } catch (const std::exception& error) {
      failure = error.what();
      port = -1;
    }
  }
  check_mpi(MPI_Bcast(&port, 1, MPI_INT, 0, comm), "MPI_Bcast");
  LOCKSTEP_CHECK(port > 0, rank == 0 ? failure : "lockstep_trainer_create_mpi: rank 0 could not choose where to meet");
  check_mpi(MPI_Bcast(address, sizeof(address), MPI_CHAR, 0, comm), "MPI_Bcast");
  init_process_group(InitOptions()
                         .rank(rank)
                         .world_size(size)
                         .master_addr(address)
                         .master_port(port)
                         .node_rank(node_index)
                         .local_rank(local_rank)
                         .local_world_size(local_size)
                         .launcher("mpi"));
  return true;
}

lockstep_status create_from_communicator(const char* config_path, MPI_Comm comm, const char* const* overrides,
                                         int32_t count, lockstep_trainer* out) {
  bool started = false;
  const lockstep_status status =
      create_trainer(config_path, overrides, count, out, [&] { started = init_from_communicator(comm); });
  // A trainer that could not be built leaves no group behind: the program may try again.
  if (status != LOCKSTEP_OK && started) destroy_process_group();
  return status;
}

}  // namespace
}  // namespace lockstep

extern "C" {

lockstep_status lockstep_trainer_create_mpi(const char* config_path, MPI_Comm comm, lockstep_trainer* out) {
  return lockstep::create_from_communicator(config_path, comm, nullptr, 0, out);
}

lockstep_status lockstep_trainer_create_mpi_with(const char* config_path, MPI_Comm comm, const char* const* overrides,
                                                 int32_t count, lockstep_trainer* out) {
  return lockstep::create_from_communicator(config_path, comm, overrides, count, out);
}

lockstep_status lockstep_trainer_create_mpi_fortran(const char* config_path, MPI_Fint comm,
                                                    const char* const* overrides, int32_t count,
                                                    lockstep_trainer* out) {
  return lockstep::create_from_communicator(config_path, MPI_Comm_f2c(comm), overrides, count, out);
}

}  // extern "C"

#endif  // LOCKSTEP_WITH_MPI
