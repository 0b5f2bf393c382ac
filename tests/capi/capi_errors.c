/* Every kind of bad input to lockstep's C API, from a C program that goes on
 * after each error: each call must return the status this expects and a
 * message naming what was wrong, never abort or hang the program.
 *
 *   capi_errors CONFIG BAD_CONFIG WORK_DIR           (one process)
 *   capi_errors CONFIG - WORK_DIR mismatch           (2 ranks: rank 1 predicts while rank 0 trains)
 *
 * Prints "ok <case>" per case that behaved and "FAILED <case>: ..." per case
 * that did not; the last line is "capi_errors: N failed".
 */
#include <lockstep/lockstep.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;

static void expect(const char* name, lockstep_status got, lockstep_status want, const char* needle) {
  const char* message = lockstep_last_error();
  if (got != want) {
    printf("FAILED %s: status %d, expected %d (%s)\n", name, (int)got, (int)want, message);
    ++failures;
  } else if (needle != NULL && strstr(message, needle) == NULL) {
    printf("FAILED %s: the message does not say '%s': %s\n", name, needle, message);
    ++failures;
  } else {
    printf("ok %s: %s\n", name, message);
  }
  fflush(stdout);
}

static float pixels[4 * 28 * 28];
static int32_t labels[4] = {1, 2, 3, 4};
static const int64_t image_shape[4] = {4, 1, 28, 28};
static const int64_t label_shape[1] = {4};

static lockstep_trainer make(const char* config, const char* work_dir) {
  char override[4096];
  snprintf(override, sizeof override, "work_dir=%s", work_dir);
  const char* overrides[] = {override};
  lockstep_trainer trainer = NULL;
  lockstep_status status = lockstep_trainer_create_with(config, overrides, 1, &trainer);
  expect("create", status, LOCKSTEP_OK, NULL);
  return trainer;
}

static int mismatch(const char* config, const char* work_dir) {
  lockstep_trainer trainer = make(config, work_dir);
  if (trainer == NULL) return 1;
  int32_t rank = 0, world = 1;
  lockstep_trainer_rank(trainer, &rank, &world);
  lockstep_tensor x = {pixels, 4, image_shape, LOCKSTEP_FLOAT32, -1};
  lockstep_tensor y = {labels, 1, label_shape, LOCKSTEP_INT32, -1};
  double loss = 0;
  if (rank == 0) {
    expect("rank 0 trains while rank 1 predicts", lockstep_train_step(trainer, &x, &y, &loss),
           LOCKSTEP_ERR_DISTRIBUTED, "rank 1 called predict");
  } else {
    float logits[4 * 10];
    const int64_t logits_shape[2] = {4, 10};
    lockstep_tensor out = {logits, 2, logits_shape, LOCKSTEP_FLOAT32, -1};
    expect("rank 1 predicts while rank 0 trains", lockstep_predict(trainer, &x, &out), LOCKSTEP_ERR_DISTRIBUTED,
           "rank 0 called train_step");
  }
  /* Both go on, in step again. */
  expect("a step after the mismatch", lockstep_train_step(trainer, &x, &y, &loss), LOCKSTEP_OK, NULL);
  expect("destroy", lockstep_trainer_destroy(trainer), LOCKSTEP_OK, NULL);
  printf("capi_errors: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: capi_errors CONFIG BAD_CONFIG WORK_DIR [mismatch]\n");
    return 2;
  }
  const char* config = argv[1];
  const char* bad_config = argv[2];
  const char* work_dir = argv[3];
  if (argc > 4 && strcmp(argv[4], "mismatch") == 0) return mismatch(config, work_dir);

  lockstep_trainer none = NULL;
  expect("create with a null out", lockstep_trainer_create(config, NULL), LOCKSTEP_ERR_ARGUMENT, "out is null");
  expect("create with a null path", lockstep_trainer_create(NULL, &none), LOCKSTEP_ERR_ARGUMENT, "config_path is null");
  expect("create from a missing file", lockstep_trainer_create("/nonexistent/run.yaml", &none), LOCKSTEP_ERR_IO,
         "/nonexistent/run.yaml");
  expect("create from a config with an unknown key", lockstep_trainer_create(bad_config, &none), LOCKSTEP_ERR_CONFIG,
         "bad.yaml:");
  if (none != NULL) printf("FAILED a failed create left a handle\n");
  {
    /* A create that fails after the work dir was made leaves nothing behind. */
    char failed_dir[4096], override[4200];
    snprintf(failed_dir, sizeof failed_dir, "%s_failed_create", work_dir);
    snprintf(override, sizeof override, "work_dir=%s/nested", failed_dir);
    const char* overrides[] = {override, "model.type=NoSuchModel"};
    expect("create with an unknown model", lockstep_trainer_create_with(config, overrides, 2, &none),
           LOCKSTEP_ERR_CONFIG, "NoSuchModel");
    if (access(failed_dir, F_OK) == 0) {
      printf("FAILED a failed create left its work dir %s behind\n", failed_dir);
      ++failures;
    }
  }

  lockstep_trainer trainer = make(config, work_dir);
  if (trainer == NULL) return 1;
  lockstep_tensor x = {pixels, 4, image_shape, LOCKSTEP_FLOAT32, -1};
  lockstep_tensor y = {labels, 1, label_shape, LOCKSTEP_INT32, -1};
  double loss = 0;

  expect("train_step on a null handle", lockstep_train_step(NULL, &x, &y, &loss), LOCKSTEP_ERR_ARGUMENT,
         "handle is null");
  expect("a null input", lockstep_train_step(trainer, NULL, &y, &loss), LOCKSTEP_ERR_ARGUMENT, "input is null");
  expect("a null target", lockstep_train_step(trainer, &x, NULL, &loss), LOCKSTEP_ERR_ARGUMENT, "target is null");
  lockstep_tensor no_data = {NULL, 4, image_shape, LOCKSTEP_FLOAT32, -1};
  expect("a null buffer", lockstep_train_step(trainer, &no_data, &y, &loss), LOCKSTEP_ERR_ARGUMENT,
         "input: data is null");
  lockstep_tensor no_shape = {pixels, 4, NULL, LOCKSTEP_FLOAT32, -1};
  expect("a null shape", lockstep_train_step(trainer, &no_shape, &y, &loss), LOCKSTEP_ERR_ARGUMENT,
         "input: shape is null");
  const int64_t negative[4] = {4, 1, -28, 28};
  lockstep_tensor negative_shape = {pixels, 4, negative, LOCKSTEP_FLOAT32, -1};
  expect("a negative size", lockstep_train_step(trainer, &negative_shape, &y, &loss), LOCKSTEP_ERR_ARGUMENT,
         "shape[2] is negative");
  lockstep_tensor bad_dtype = {pixels, 4, image_shape, (lockstep_dtype)42, -1};
  expect("an unknown dtype", lockstep_train_step(trainer, &bad_dtype, &y, &loss), LOCKSTEP_ERR_ARGUMENT,
         "dtype 42");
  lockstep_tensor on_gpu = {pixels, 4, image_shape, LOCKSTEP_FLOAT32, 7};
  expect("a CUDA device this process lacks", lockstep_train_step(trainer, &on_gpu, &y, &loss), LOCKSTEP_ERR_ARGUMENT,
         "device 7");
  const int64_t three_channels[4] = {1, 3, 28, 28};
  lockstep_tensor wrong_shape = {pixels, 4, three_channels, LOCKSTEP_FLOAT32, -1};
  const int64_t one_label[1] = {1};
  lockstep_tensor one = {labels, 1, one_label, LOCKSTEP_INT32, -1};
  expect("a shape the model cannot take", lockstep_train_step(trainer, &wrong_shape, &one, &loss),
         LOCKSTEP_ERR_ARGUMENT, "has shape [1, 3, 28, 28]");
  float logits[4 * 10];
  const int64_t short_shape[2] = {4, 9};
  lockstep_tensor short_output = {logits, 2, short_shape, LOCKSTEP_FLOAT32, -1};
  expect("predict into a wrong-shaped output", lockstep_predict(trainer, &x, &short_output), LOCKSTEP_ERR_ARGUMENT,
         "output has shape [4, 9] but the prediction has shape [4, 10]");
  expect("load a missing checkpoint", lockstep_load_checkpoint(trainer, "/nonexistent/model.ckpt", NULL),
         LOCKSTEP_ERR_IO, "/nonexistent/model.ckpt");
  {
    /* A path under a file cannot be written: an I/O failure, not an internal one. */
    char under_a_file[4200];
    snprintf(under_a_file, sizeof under_a_file, "%s/under_a_file.ckpt", config);
    expect("save a checkpoint under a file", lockstep_save_checkpoint(trainer, under_a_file), LOCKSTEP_ERR_IO,
           "under_a_file.ckpt");
  }
  expect("log a scalar without a name", lockstep_log_scalar(trainer, NULL, 1.0), LOCKSTEP_ERR_ARGUMENT,
         "name is null");

  /* After every error the trainer still trains, predicts and ends well. */
  expect("a good step after the errors", lockstep_train_step(trainer, &x, &y, &loss), LOCKSTEP_OK, NULL);
  const int64_t logits_shape[2] = {4, 10};
  lockstep_tensor output = {logits, 2, logits_shape, LOCKSTEP_FLOAT32, -1};
  expect("a good prediction", lockstep_predict(trainer, &x, &output), LOCKSTEP_OK, NULL);
  {
    /* The same prediction into a float64 array: the float32 values, widened. */
    double logits64[4 * 10];
    lockstep_tensor output64 = {logits64, 2, logits_shape, LOCKSTEP_FLOAT64, -1};
    expect("a prediction into a float64 output", lockstep_predict(trainer, &x, &output64), LOCKSTEP_OK, NULL);
    for (int i = 0; i < 4 * 10; ++i) {
      if (logits64[i] != (double)logits[i]) {
        printf("FAILED the float64 prediction differs at %d: %.9g against %.9g\n", i, logits64[i], (double)logits[i]);
        ++failures;
        break;
      }
    }
    int32_t classes[4 * 10];
    lockstep_tensor integers = {classes, 2, logits_shape, LOCKSTEP_INT32, -1};
    expect("a floating-point prediction into an integer output", lockstep_predict(trainer, &x, &integers),
           LOCKSTEP_ERR_ARGUMENT, "output has dtype LOCKSTEP_INT32");
  }
  int64_t iteration = -1;
  lockstep_trainer_iteration(trainer, &iteration);
  if (iteration != 1) {
    printf("FAILED the failed steps were counted: iteration %lld, expected 1\n", (long long)iteration);
    ++failures;
  }
  expect("destroy", lockstep_trainer_destroy(trainer), LOCKSTEP_OK, NULL);
  expect("train_step on a destroyed handle", lockstep_train_step(trainer, &x, &y, &loss), LOCKSTEP_ERR_ARGUMENT,
         "not a live trainer");
  expect("destroy twice", lockstep_trainer_destroy(trainer), LOCKSTEP_ERR_ARGUMENT, "not a live trainer");
  printf("capi_errors: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
