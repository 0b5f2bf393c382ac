// Meeting over MPI: where lockstep's ranks learn who they are and where rank
// 0 listens from MPI instead of a launcher's environment. Used by
// lockstep_trainer_create_mpi (a communicator the program owns) and by
// `lockstep train` under mpirun without MASTER_ADDR (MPI_COMM_WORLD, MPI
// started and finished by lockstep). Only in a build with MPI
// (LOCKSTEP_WITH_MPI); without it can_meet_over_mpi() is false and the
// functions fail saying so.
//
//   if (env.master_addr.empty() && can_meet_over_mpi()) {
//     MpiMeeting meeting = meet_over_mpi_world();   // collective over MPI_COMM_WORLD
//     init_process_group(meeting.init_options());
//   }
#pragma once

#include <string>

#include "lockstep/comm/init.h"

namespace lockstep {

struct MpiMeeting {
  int rank = 0;
  int size = 1;
  int local_rank = 0;   // in the node-local split of the communicator
  int local_size = 1;
  int node_index = 0;   // the node's place among the nodes, by their first rank
  std::string master_addr;
  int master_port = 0;
  // The process group's options (rank, size, address, node, local rank), launcher "mpi".
  InitOptions init_options() const;
};

bool can_meet_over_mpi();

// Collective over the communicator whose Fortran handle is `fortran_comm`
// (MPI_Comm_c2f; portable across MPI implementations, unlike MPI_Comm).
// MPI must be initialised. Rank 0 picks a free port and its address
// (127.0.0.1 when every rank shares its node, else its first IPv4 address
// that is up and not loopback) and broadcasts both; `who` starts errors.
MpiMeeting meet_over_mpi(int fortran_comm, const std::string& who);

// The same over MPI_COMM_WORLD, initialising MPI first when the program has
// not (and finalising it at exit then).
MpiMeeting meet_over_mpi_world(const std::string& who);

}  // namespace lockstep
