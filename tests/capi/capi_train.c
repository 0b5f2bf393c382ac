/* Trains through lockstep's C API the way a program that owns its loop does:
 * it holds its data in its own arrays and hands lockstep one batch per step.
 *
 *   capi_train [--mpi] [--float64] CONFIG DATA WORK_DIR ITERS BATCH [STOP_AFTER [RESUME_FROM]]
 *
 * With --mpi (built with MPI) it runs under mpirun and starts lockstep from
 * MPI_COMM_WORLD (lockstep_trainer_create_mpi_with); without, from the
 * launcher's environment (lockstep run, torchrun). With --float64 it hands
 * lockstep the images as float64 arrays (the same values), as a simulation
 * code holding double-precision fields would.
 *
 * DATA: int64 N, N*1*28*28 float32 pixels, N int32 labels (tests write it
 * from Fashion-MNIST). Rank r of W trains, at step s, samples r + W*(s*BATCH
 * + j), j < BATCH: lockstep's DefaultSampler order without shuffling, so a run
 * is comparable with `lockstep train` and with PyTorch's DDP on the same data.
 * STOP_AFTER (>= 0): save checkpoint "interrupted" after that step and leave at
 * once, as a job that was stopped. RESUME_FROM: load that checkpoint first
 * and go on from the iteration after it. The config's checkpoint hook writes
 * model_final when the run ends. Exit status 0 on success, 1 with the error
 * (and its lockstep_status) on stderr.
 */
#include <lockstep/lockstep.h>
#ifdef LOCKSTEP_CAPI_TEST_MPI
#include <lockstep/lockstep_mpi.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const char* what, lockstep_status status) {
  fprintf(stderr, "capi_train: %s failed (status %d): %s\n", what, (int)status, lockstep_last_error());
  return 1;
}

int main(int argc, char** argv) {
  int use_mpi = 0;
  (void)use_mpi; /* read only in a build with MPI */
  if (argc > 1 && strcmp(argv[1], "--mpi") == 0) {
#ifdef LOCKSTEP_CAPI_TEST_MPI
    use_mpi = 1;
    MPI_Init(&argc, &argv);
    ++argv;
    --argc;
#else
    fprintf(stderr, "capi_train: built without MPI\n");
    return 77;
#endif
  }
  int use_float64 = 0;
  if (argc > 1 && strcmp(argv[1], "--float64") == 0) {
    use_float64 = 1;
    ++argv;
    --argc;
  }
  if (argc < 6) {
    fprintf(stderr, "usage: capi_train CONFIG DATA WORK_DIR ITERS BATCH [STOP_AFTER [RESUME_FROM]]\n");
    return 2;
  }
  const char* config = argv[1];
  const int64_t iters = atoll(argv[4]);
  const int64_t batch = atoll(argv[5]);
  const int64_t stop_after = argc > 6 ? atoll(argv[6]) : -1;
  const char* resume_from = argc > 7 ? argv[7] : NULL;

  FILE* data = fopen(argv[2], "rb");
  if (data == NULL) {
    fprintf(stderr, "capi_train: cannot open %s\n", argv[2]);
    return 1;
  }
  int64_t count = 0;
  if (fread(&count, sizeof count, 1, data) != 1 || count <= 0) return 1;
  const int64_t pixels = 28 * 28;
  float* images = malloc((size_t)(count * pixels) * sizeof(float));
  int32_t* labels = malloc((size_t)count * sizeof(int32_t));
  if (fread(images, sizeof(float), (size_t)(count * pixels), data) != (size_t)(count * pixels) ||
      fread(labels, sizeof(int32_t), (size_t)count, data) != (size_t)count) {
    fprintf(stderr, "capi_train: %s is short\n", argv[2]);
    return 1;
  }
  fclose(data);

  char work_dir[4096];
  snprintf(work_dir, sizeof work_dir, "work_dir=%s", argv[3]);
  const char* overrides[] = {work_dir, "train_dataloader=null"};
  lockstep_trainer trainer = NULL;
  lockstep_status status;
#ifdef LOCKSTEP_CAPI_TEST_MPI
  if (use_mpi) {
    status = lockstep_trainer_create_mpi_with(config, MPI_COMM_WORLD, overrides, 2, &trainer);
  } else
#endif
  {
    status = lockstep_trainer_create_with(config, overrides, 2, &trainer);
  }
  if (status != LOCKSTEP_OK) return fail("lockstep_trainer_create", status);
  int32_t rank = 0, world = 1;
  lockstep_trainer_rank(trainer, &rank, &world);

  int64_t start = 0;
  if (resume_from != NULL) {
    int64_t saved = -1;
    status = lockstep_load_checkpoint(trainer, resume_from, &saved);
    if (status != LOCKSTEP_OK) return fail("lockstep_load_checkpoint", status);
    lockstep_trainer_iteration(trainer, &start);
    if (rank == 0) printf("capi_train: resumed after iteration %lld\n", (long long)saved);
  }

  float* x = malloc((size_t)(batch * pixels) * sizeof(float));
  double* x64 = malloc((size_t)(batch * pixels) * sizeof(double));
  int32_t* y = malloc((size_t)batch * sizeof(int32_t));
  const int64_t x_shape[4] = {batch, 1, 28, 28};
  const int64_t y_shape[1] = {batch};
  for (int64_t step = start; step < iters; ++step) {
    for (int64_t j = 0; j < batch; ++j) {
      const int64_t sample = rank + (int64_t)world * (step * batch + j);
      if (sample >= count) {
        fprintf(stderr, "capi_train: the data file holds %lld samples, step %lld needs sample %lld\n",
                (long long)count, (long long)step, (long long)sample);
        return 1;
      }
      memcpy(x + j * pixels, images + sample * pixels, (size_t)pixels * sizeof(float));
      y[j] = labels[sample];
    }
    if (use_float64) {
      for (int64_t i = 0; i < batch * pixels; ++i) x64[i] = (double)x[i];
    }
    lockstep_tensor input = {x, 4, x_shape, LOCKSTEP_FLOAT32, -1};
    if (use_float64) {
      input.data = x64;
      input.dtype = LOCKSTEP_FLOAT64;
    }
    lockstep_tensor target = {y, 1, y_shape, LOCKSTEP_INT32, -1};
    double loss = 0;
    status = lockstep_train_step(trainer, &input, &target, &loss);
    if (status != LOCKSTEP_OK) return fail("lockstep_train_step", status);
    if (rank == 0 && step % 5 == 0) printf("capi_train: step %lld loss %.4f\n", (long long)step, loss);
    if (step == stop_after) {
      status = lockstep_save_checkpoint(trainer, "interrupted");
      if (status != LOCKSTEP_OK) return fail("lockstep_save_checkpoint", status);
      fflush(stdout);
      _exit(0); /* stopped: no orderly end of the run (nor of MPI's) */
    }
  }
  status = lockstep_trainer_destroy(trainer);
  if (status != LOCKSTEP_OK) return fail("lockstep_trainer_destroy", status);
  free(images);
  free(labels);
  free(x);
  free(x64);
  free(y);
#ifdef LOCKSTEP_CAPI_TEST_MPI
  if (use_mpi) MPI_Finalize();
#endif
  return 0;
}
