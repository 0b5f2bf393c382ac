/* In-situ training from a C simulation: heat.F90's solver in C (read that
 * file for the physics and the protocol), through lockstep's C API started
 * from MPI_COMM_WORLD.
 *
 *   mpirun -np 2 build/examples/insitu_heat_c examples/insitu/insitu.yaml work_dirs/insitu/surrogate.pt [WORK_DIR]
 */
#include <lockstep/lockstep_mpi.h>

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NX = 64, NY = 64, TRAIN_STEPS = 400, EVALUATE_EVERY = 50 };
static const float R = 0.2f, BOUND = 0.05f;
static int rank, ranks, rows, first_row;

/* Row-major: field[row][x], rows 0 and rows+1 are halos, x 0 and NX+1 are zero. */
#define AT(f, row, x) (f)[(row) * (NX + 2) + (x)]

static void check(lockstep_status status, const char* what) {
  if (status == LOCKSTEP_OK) return;
  fprintf(stderr, "heat: rank %d: %s failed (status %d): %s\n", rank, what, (int)status, lockstep_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* The solver's step of rows [1, n] of `in` (zero beyond it) into out[0..n). */
static void step_rows(const float* in, int n, float* out) {
  for (int j = 1; j <= n; ++j)
    for (int x = 1; x <= NX; ++x)
      out[(j - 1) * NX + x - 1] = AT(in, j, x) + R * (AT(in, j, x - 1) + AT(in, j, x + 1) + AT(in, j - 1, x) +
                                                      AT(in, j + 1, x) - 4 * AT(in, j, x));
}

/* The window (rows and halos) and its step, zero beyond it. */
static void window_pair(const float* u, float* window, float* next) {
  float* padded = calloc((size_t)(rows + 4) * (NX + 2), sizeof(float));
  for (int j = 0; j < rows + 2; ++j) {
    memcpy(&AT(padded, j + 1, 1), &AT(u, j, 1), NX * sizeof(float));
    memcpy(window + j * NX, &AT(u, j, 1), NX * sizeof(float));
  }
  step_rows(padded, rows + 2, next);
  free(padded);
}

static void exchange(float* u) {
  const int up = rank == 0 ? MPI_PROC_NULL : rank - 1, down = rank == ranks - 1 ? MPI_PROC_NULL : rank + 1;
  MPI_Sendrecv(&AT(u, 1, 1), NX, MPI_FLOAT, up, 1, &AT(u, rows + 1, 1), NX, MPI_FLOAT, down, 1, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  MPI_Sendrecv(&AT(u, rows, 1), NX, MPI_FLOAT, down, 2, &AT(u, 0, 1), NX, MPI_FLOAT, up, 2, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
}

static float next_uniform(long long* state) {
  *state = (*state * 1103515245LL + 12345LL) % 2147483647LL;
  return (float)(*state % 100000) / 100000.0f;
}

static void add_heat(float* u, long long seed) {
  for (int blob = 0; blob < 3; ++blob) {
    const float cx = next_uniform(&seed) * NX, cy = next_uniform(&seed) * NY;
    const float width = 3 + 6 * next_uniform(&seed), height = 0.5f + next_uniform(&seed);
    for (int j = 1; j <= rows; ++j)
      for (int x = 1; x <= NX; ++x)
        AT(u, j, x) += height * expf(-((x - cx) * (x - cx) + (first_row + j - cy) * (first_row + j - cy)) /
                                     (2 * width * width));
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (argc < 3 || NY % ranks != 0) {
    if (rank == 0) fprintf(stderr, "usage: heat CONFIG SURROGATE.pt (on a number of ranks that divides %d)\n", NY);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  rows = NY / ranks;
  first_row = rank * rows;
  char model_path[4096], work_dir[4096];
  snprintf(model_path, sizeof model_path, "model.path=%s", argv[2]);
  snprintf(work_dir, sizeof work_dir, "work_dir=%s", argc > 3 ? argv[3] : "work_dirs/insitu");
  const char* overrides[] = {model_path, work_dir};
  lockstep_trainer trainer;
  check(lockstep_trainer_create_mpi_with(argv[1], MPI_COMM_WORLD, overrides, 2, &trainer), "create");

  const size_t cells = (size_t)(rows + 2) * (NX + 2), window_cells = (size_t)(rows + 2) * NX;
  float *u = calloc(cells, sizeof(float)), *held_out = calloc(cells, sizeof(float));
  float *window = malloc(window_cells * sizeof(float)), *next = malloc(window_cells * sizeof(float));
  float* predicted = malloc(window_cells * sizeof(float));
  const int64_t shape[4] = {1, 1, rows + 2, NX};
  lockstep_tensor input = {window, 4, shape, LOCKSTEP_FLOAT32, -1};
  lockstep_tensor target = {next, 4, shape, LOCKSTEP_FLOAT32, -1};
  lockstep_tensor output = {predicted, 4, shape, LOCKSTEP_FLOAT32, -1};
  add_heat(u, 12345);
  exchange(u);
  for (int j = 1; j <= rows; ++j)
    for (int x = 1; x <= NX; ++x)
      AT(held_out, j, x) = sinf(3.1f * x / NX) * sinf(2.3f * (first_row + j) / NY) +
                           expf(-60 * (powf((float)x / NX - 0.3f, 2) + powf((float)(first_row + j) / NY - 0.6f, 2)));
  exchange(held_out);

  double error = 1;
  float* stepped = malloc((size_t)rows * NX * sizeof(float));
  for (int step = 1, trained = 0; trained < TRAIN_STEPS; ++step) {
    if (step % 150 == 0) add_heat(u, 777 + step);
    step_rows(u, rows, stepped);
    for (int j = 1; j <= rows; ++j) memcpy(&AT(u, j, 1), stepped + (j - 1) * NX, NX * sizeof(float));
    exchange(u);
    if (step % 2 != 0) continue;
    window_pair(u, window, next);
    double loss = 0;
    check(lockstep_train_step(trainer, &input, &target, &loss), "lockstep_train_step");
    if (++trained % EVALUATE_EVERY != 0 && trained != TRAIN_STEPS) continue;
    window_pair(held_out, window, next);
    check(lockstep_predict(trainer, &input, &output), "lockstep_predict");
    double local[2] = {0, 0}, total[2];
    for (size_t i = NX; i < window_cells - NX; ++i) {  /* this rank's rows, not the halos */
      local[0] += (double)(predicted[i] - next[i]) * (predicted[i] - next[i]);
      local[1] += (double)(window[i] - next[i]) * (window[i] - next[i]);
    }
    MPI_Allreduce(local, total, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    error = total[0] / total[1];
    if (rank == 0) printf("heat: training step %4d: surrogate error on held-out states %8.5f, loss %.3e\n", trained, error, loss);
    check(lockstep_log_scalar(trainer, "held_out_error", error), "lockstep_log_scalar");
  }
  check(lockstep_trainer_destroy(trainer), "lockstep_trainer_destroy");
  if (rank == 0) printf("heat: final surrogate error %.5f is %sbelow the bound %.3f\n", error, error < BOUND ? "" : "NOT ", BOUND);
  free(u); free(held_out); free(window); free(next); free(predicted); free(stepped);
  MPI_Finalize();
  return error < BOUND ? 0 : 1;
}
