/* lockstep's C API: train inside a program written in C, Fortran (through
 * the `lockstep` module, lockstep.f90) or anything that can call C.
 *
 * A thin, tested translation of lockstep::StepTrainer (runner/step_trainer.h):
 * one run built from a YAML config (model, optim_wrapper, param_scheduler,
 * strategy, hooks, work_dir, load_from, resume; no data loaders), trained one
 * step at a time on the caller's arrays. No C++ type appears here and no
 * exception crosses it: every function returns a status, and
 * lockstep_last_error() says what went wrong (this thread's last message).
 *
 *   lockstep_trainer trainer;
 *   if (lockstep_trainer_create("surrogate.yaml", &trainer) != LOCKSTEP_OK) {
 *     fprintf(stderr, "%s\n", lockstep_last_error());
 *     return 1;
 *   }
 *   int64_t shape[4] = {8, 1, 32, 32};
 *   lockstep_tensor x = {field, 4, shape, LOCKSTEP_FLOAT32, -1};
 *   lockstep_tensor y = {next_field, 4, shape, LOCKSTEP_FLOAT32, -1};
 *   double loss;
 *   lockstep_train_step(trainer, &x, &y, &loss);
 *   lockstep_trainer_destroy(trainer);             // ends the run: final checkpoint
 *
 * Arrays are dense and row-major (C order), as the shape gives them; a
 * Fortran array of shape (n1, ..., nk) is passed with the shape reversed
 * (lockstep.f90 does it). Inputs and targets are read where they lie,
 * without a copy, when their dtype is what the model computes in. Otherwise
 * they are converted in one copy: floating point (a float64 field, Fortran's
 * real(8)) to the model's dtype (its parameters', float32 mostly), and int32
 * (integer(4) class indices) to int64, as PyTorch's losses take them. A
 * float64 array of values float32 holds exactly trains bitwise as the float32
 * array would. `predict` writes a floating-point prediction into a float32 or
 * float64 output. `device` -1 is host memory, n >= 0 CUDA
 * device n. The batch entries filled are the model's (lockstep's classifiers:
 * "image" and "label"; a TorchScriptModel's input_key and target_key).
 *
 * Under a launcher (lockstep run, torchrun, srun, mpirun) every rank creates
 * the trainer and calls the collective functions -- create, train_step,
 * predict, save_checkpoint, load_checkpoint, destroy -- in the same order; a
 * rank that calls another one fails every rank with a message naming both.
 */
#ifndef LOCKSTEP_LOCKSTEP_H_
#define LOCKSTEP_LOCKSTEP_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lockstep_trainer_s* lockstep_trainer; /* opaque */

typedef enum {
  LOCKSTEP_OK = 0,
  LOCKSTEP_ERR_ARGUMENT,    /* a null, destroyed or wrong handle, array, shape, dtype or name */
  LOCKSTEP_ERR_CONFIG,      /* the config: file:line (key ...) and what is wrong */
  LOCKSTEP_ERR_IO,          /* a file that cannot be read or written (a checkpoint path under a file) */
  LOCKSTEP_ERR_DISTRIBUTED, /* another rank failed, the ranks disagree, or a collective timed out */
  LOCKSTEP_ERR_INTERNAL     /* anything else (out of memory, a bug): the message says what */
} lockstep_status;

typedef enum { LOCKSTEP_FLOAT32, LOCKSTEP_FLOAT64, LOCKSTEP_INT32, LOCKSTEP_INT64 } lockstep_dtype;

typedef struct {
  void* data;
  int32_t ndim;
  const int64_t* shape; /* ndim sizes, outermost first */
  lockstep_dtype dtype;
  int32_t device; /* -1 host, else CUDA index */
} lockstep_tensor;

/* Builds the run the YAML file describes (and the process group, from the
 * launcher's environment). A create that fails leaves no work dir behind. */
lockstep_status lockstep_trainer_create(const char* config_path, lockstep_trainer* out);
/* The same with `count` overrides, each "key=value" as `lockstep train --set`
 * takes them ("work_dir=/scratch/run", "resume=true", "optim_wrapper.optimizer.lr=0.01"). */
lockstep_status lockstep_trainer_create_with(const char* config_path, const char* const* overrides, int32_t count,
                                             lockstep_trainer* out);
/* One training iteration on (input, target); `loss` (may be null) receives
 * the iteration's loss, averaged over ranks where the logger gathers it, else
 * this rank's. On failure the iteration is not counted (under DDP it was
 * dropped on every rank) and the program may go on. */
lockstep_status lockstep_train_step(lockstep_trainer, const lockstep_tensor* input, const lockstep_tensor* target,
                                    double* loss);
/* The model's prediction for `input`, written into the caller's `output`,
 * whose shape must be the prediction's; a floating-point prediction goes into
 * a float32 or float64 array, an integer one into int32 or int64. */
lockstep_status lockstep_predict(lockstep_trainer, const lockstep_tensor* input, lockstep_tensor* output);
/* A checkpoint a run resumes from bitwise: a name in the work dir
 * ("step_000100"), or a path ending in ".ckpt". */
lockstep_status lockstep_save_checkpoint(lockstep_trainer, const char* path);
/* Continues from a checkpoint; `iteration` (may be null) receives the
 * iteration it was written after. */
lockstep_status lockstep_load_checkpoint(lockstep_trainer, const char* path, int64_t* iteration);
/* A scalar for the writers (console, metrics.jsonl, TensorBoard). */
lockstep_status lockstep_log_scalar(lockstep_trainer, const char* name, double value);
/* The iteration the next train_step runs. */
lockstep_status lockstep_trainer_iteration(lockstep_trainer, int64_t* iteration);
/* This process's rank and the number of ranks. */
lockstep_status lockstep_trainer_rank(lockstep_trainer, int32_t* rank, int32_t* world_size);
/* Ends the run (the final checkpoint, the writers' last write) and frees the
 * trainer; the handle is invalid afterwards, also when this fails. */
lockstep_status lockstep_trainer_destroy(lockstep_trainer);
/* This thread's last error message ("" after a success); valid until this
 * thread's next lockstep call. */
const char* lockstep_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* LOCKSTEP_LOCKSTEP_H_ */
