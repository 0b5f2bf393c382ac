// lockstep_trainer_create_mpi (lockstep/lockstep_mpi.h): the process group
// from an MPI communicator. Compiled to something only with MPI
// (LOCKSTEP_WITH_MPI, set by CMake when it finds MPI).
#if defined(LOCKSTEP_WITH_MPI)

#include "lockstep/lockstep_mpi.h"

#include <string>

#include "lockstep/capi/internal/calls.h"
#include "lockstep/core/error.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/mpi_meeting.h"

namespace lockstep {
namespace {

// The process group from `comm` (Note [A process group from an MPI
// communicator], comm/mpi_meeting.cpp). Returns false when the process group
// of an earlier trainer over the same ranks is still there (it is used again).
bool init_from_communicator(MPI_Comm comm) {
  const char* const who = "lockstep_trainer_create_mpi";
  int initialized = 0;
  MPI_Initialized(&initialized);
  LOCKSTEP_CHECK(initialized, who, ": call MPI_Init before creating a trainer from a communicator");
  LOCKSTEP_CHECK(comm != MPI_COMM_NULL, who, ": the communicator is MPI_COMM_NULL");
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (is_initialized()) {
    LOCKSTEP_CHECK(world()->rank() == rank && world()->size() == size, who, ": this process already has a lockstep "
                   "process group of ", world()->size(), " ranks (it is rank ", world()->rank(), "), made for another "
                   "communicator of ", size, " ranks; one group per process");
    return false;
  }
  init_process_group(meet_over_mpi(static_cast<int>(MPI_Comm_c2f(comm)), who).init_options());
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
