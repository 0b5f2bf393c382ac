/* lockstep's C API started from an MPI communicator: for simulation codes
 * that run under mpirun and already have one. Present when lockstep was built
 * with MPI (Debian's libopenmpi-dev found at configure time; the package's
 * LockstepConfig.cmake then sets LOCKSTEP_WITH_MPI).
 *
 *   MPI_Init(&argc, &argv);
 *   lockstep_trainer trainer;
 *   if (lockstep_trainer_create_mpi("surrogate.yaml", MPI_COMM_WORLD, &trainer) != LOCKSTEP_OK) {
 *     fprintf(stderr, "%s\n", lockstep_last_error());
 *     MPI_Abort(MPI_COMM_WORLD, 1);
 *   }
 *   ... lockstep_train_step(trainer, &x, &y, &loss) ...
 *   lockstep_trainer_destroy(trainer);
 *   MPI_Finalize();
 *
 * The ranks of `comm` are the training ranks, in its order; no MASTER_ADDR,
 * MASTER_PORT or launcher variable is needed: rank 0 picks a free port and
 * shares its address over `comm` (127.0.0.1 when every rank shares its node),
 * each rank's local rank (and so its GPU, with device: auto) comes from the
 * node-local split of `comm`, and lockstep's Gloo/NCCL groups are built
 * beside MPI's (a later trainer over the same ranks uses them again). `comm`
 * is only used inside these calls; MPI stays the program's.
 */
#ifndef LOCKSTEP_LOCKSTEP_MPI_H_
#define LOCKSTEP_LOCKSTEP_MPI_H_

/* MPI's C API only: Open MPI's and MPICH's deprecated C++ bindings would tie
 * every C++ program that includes this to libmpi_cxx. */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <lockstep/lockstep.h>

#ifdef __cplusplus
extern "C" {
#endif

lockstep_status lockstep_trainer_create_mpi(const char* config_path, MPI_Comm comm, lockstep_trainer* out);
/* With `count` "key=value" overrides, as lockstep_trainer_create_with. */
lockstep_status lockstep_trainer_create_mpi_with(const char* config_path, MPI_Comm comm, const char* const* overrides,
                                                 int32_t count, lockstep_trainer* out);
/* The same for Fortran's integer communicator handles (MPI_Comm_f2c); the
 * `lockstep` Fortran module calls it. */
lockstep_status lockstep_trainer_create_mpi_fortran(const char* config_path, MPI_Fint comm,
                                                    const char* const* overrides, int32_t count,
                                                    lockstep_trainer* out);

#ifdef __cplusplus
}
#endif

#endif /* LOCKSTEP_LOCKSTEP_MPI_H_ */
