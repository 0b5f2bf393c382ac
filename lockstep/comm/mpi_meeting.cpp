#include "lockstep/comm/mpi_meeting.h"

#include "lockstep/core/error.h"

#if defined(LOCKSTEP_WITH_MPI)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#endif

namespace lockstep {

InitOptions MpiMeeting::init_options() const {
  return InitOptions()
      .rank(rank)
      .world_size(size)
      .master_addr(master_addr)
      .master_port(master_port)
      .node_rank(node_index)
      .local_rank(local_rank)
      .local_world_size(local_size)
      .launcher("mpi");
}

#if defined(LOCKSTEP_WITH_MPI)

namespace {

void check_mpi(int code, const char* call, const std::string& who) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw DistributedError(str_cat(who, ": ", call, " failed: ", std::string(text, length)));
}

// A TCP port free a moment ago, on this host.
int free_port(const std::string& who) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  LOCKSTEP_CHECK(fd >= 0, who, ": cannot open a socket: ", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  LOCKSTEP_CHECK(ok, who, ": cannot find a free port: ", std::strerror(errno));
  return ntohs(address.sin_port);
}

// This host's first IPv4 address on an interface that is up and not loopback.
std::string host_address(const std::string& who) {
  ifaddrs* all = nullptr;
  LOCKSTEP_CHECK(::getifaddrs(&all) == 0, who, ": cannot list network interfaces: ", std::strerror(errno));
  std::string found;
  for (ifaddrs* entry = all; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN];
    const auto* ip = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (::inet_ntop(AF_INET, &ip->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  ::freeifaddrs(all);
  LOCKSTEP_CHECK(!found.empty(), who, ": rank 0 has no network interface other ranks could reach (no IPv4 address "
                 "that is up and not loopback)");
  return found;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

bool can_meet_over_mpi() { return true; }

// Note [A process group from an MPI communicator]
// lockstep's collectives are c10d's (Gloo, NCCL), not MPI's: MPI only tells
// each rank who it is and where rank 0 listens. Rank 0 picks a free port and
// its address and broadcasts both; the node-local split gives the local rank
// (the GPU) and the node's index. Then the ranks meet through lockstep's own
// store as under any launcher.
MpiMeeting meet_over_mpi(int fortran_comm, const std::string& who) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized", who);
  LOCKSTEP_CHECK(initialized, who, ": MPI is not initialised (call MPI_Init first)");
  MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_comm));
  LOCKSTEP_CHECK(comm != MPI_COMM_NULL, who, ": the communicator is MPI_COMM_NULL");
  MpiMeeting meeting;
  check_mpi(MPI_Comm_rank(comm, &meeting.rank), "MPI_Comm_rank", who);
  check_mpi(MPI_Comm_size(comm, &meeting.size), "MPI_Comm_size", who);
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, meeting.rank, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type", who);
  check_mpi(MPI_Comm_rank(node, &meeting.local_rank), "MPI_Comm_rank", who);
  check_mpi(MPI_Comm_size(node, &meeting.local_size), "MPI_Comm_size", who);
  // The node's index: its first rank's place among the nodes' first ranks.
  MPI_Comm leaders;
  check_mpi(MPI_Comm_split(comm, meeting.local_rank == 0 ? 0 : MPI_UNDEFINED, meeting.rank, &leaders),
            "MPI_Comm_split", who);
  if (leaders != MPI_COMM_NULL) {
    check_mpi(MPI_Comm_rank(leaders, &meeting.node_index), "MPI_Comm_rank", who);
    MPI_Comm_free(&leaders);
  }
  check_mpi(MPI_Bcast(&meeting.node_index, 1, MPI_INT, 0, node), "MPI_Bcast", who);
  MPI_Comm_free(&node);

  char address[64] = {0};
  int port = 0;
  std::string failure;
  if (meeting.rank == 0) {
    try {
      const std::string chosen = meeting.local_size == meeting.size ? std::string("127.0.0.1") : host_address(who);
      std::strncpy(address, chosen.c_str(), sizeof(address) - 1);
      port = free_port(who);
    } catch (const std::exception& error) {
      failure = error.what();
      port = -1;
    }
  }
  check_mpi(MPI_Bcast(&port, 1, MPI_INT, 0, comm), "MPI_Bcast", who);
  LOCKSTEP_CHECK(port > 0, meeting.rank == 0 ? failure : who + ": rank 0 could not choose where to meet");
  check_mpi(MPI_Bcast(address, sizeof(address), MPI_CHAR, 0, comm), "MPI_Bcast", who);
  meeting.master_addr = address;
  meeting.master_port = port;
  return meeting;
}

MpiMeeting meet_over_mpi_world(const std::string& who) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized", who);
  if (!initialized) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread", who);
    std::atexit(finalize_at_exit);
  }
  return meet_over_mpi(static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD)), who);
}

#else  // no MPI in this build

bool can_meet_over_mpi() { return false; }

MpiMeeting meet_over_mpi(int, const std::string& who) {
  LOCKSTEP_FAIL(who, ": this lockstep was built without MPI (configure with Debian's libopenmpi-dev installed)");
}

MpiMeeting meet_over_mpi_world(const std::string& who) { return meet_over_mpi(0, who); }

#endif

}  // namespace lockstep
