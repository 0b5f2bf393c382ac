// The C API (lockstep/lockstep.h) over lockstep::StepTrainer.
//
// Note [Nothing crosses the C boundary]
// A program in C or Fortran cannot catch a C++ exception: one that escapes
// terminates it, and with it a simulation that may have run for days. So every
// entry point runs its body inside `guarded`, which catches everything, files
// the message in this thread's last error and returns a status: a lockstep
// Error of the kind the call's own failures are (CONFIG for create, IO for
// checkpoints, ARGUMENT for what the arrays feed the model), DISTRIBUTED for
// another rank's failure or a failed collective, INTERNAL for anything else.
// A handle is checked against the set of live ones before use, so a null or
// destroyed handle is a status too, never a crash.
#include "lockstep/lockstep.h"
#include "lockstep/capi/internal/calls.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <ios>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/core/error.h"
#include "lockstep/model/model.h"
#include "lockstep/runner/step_trainer.h"
#include "lockstep/strategy/strategy.h"

struct lockstep_trainer_s {
  std::unique_ptr<lockstep::StepTrainer> trainer;
};

namespace lockstep {
namespace {

// A caller's argument that cannot be used; the message names it.
class ArgumentError : public Error {
 public:
  using Error::Error;
};

thread_local std::string last_error;

std::mutex& handles_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_set<const lockstep_trainer_s*>& live_handles() {
  static std::unordered_set<const lockstep_trainer_s*> handles;
  return handles;
}

StepTrainer& trainer_of(lockstep_trainer handle, const char* function) {
  if (handle == nullptr) throw ArgumentError(str_cat(function, ": the trainer handle is null"));
  std::lock_guard<std::mutex> lock(handles_mutex());
  if (live_handles().count(handle) == 0) {
    throw ArgumentError(str_cat(function, ": the trainer handle is not a live trainer (destroyed already, or never "
                                          "created by lockstep_trainer_create)"));
  }
  return *handle->trainer;
}

// Runs `body`; any exception becomes a status and this thread's last error.
template <typename Body>
lockstep_status guarded(lockstep_status own_failures, Body&& body) {
  last_error.clear();
  try {
    body();
    return LOCKSTEP_OK;
  } catch (const ArgumentError& error) {
    last_error = error.what();
    return LOCKSTEP_ERR_ARGUMENT;
  } catch (const DistributedError& error) {
    last_error = error.what();
    return LOCKSTEP_ERR_DISTRIBUTED;
  } catch (const Error& error) {
    last_error = error.what();
    return own_failures;
  } catch (const c10::Error& error) {
    // libtorch refusing what the arrays hold (shapes, dtypes) for the model,
    // or a file it cannot read or write (a checkpoint call's own failure).
    last_error = describe_exception(std::current_exception());
    return own_failures == LOCKSTEP_ERR_ARGUMENT || own_failures == LOCKSTEP_ERR_IO ? own_failures
                                                                                     : LOCKSTEP_ERR_INTERNAL;
  } catch (const std::filesystem::filesystem_error& error) {
    // A path that cannot be made or written (a checkpoint under a file), whatever the call.
    last_error = error.what();
    return LOCKSTEP_ERR_IO;
  } catch (const std::ios_base::failure& error) {
    last_error = error.what();
    return LOCKSTEP_ERR_IO;
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
    return LOCKSTEP_ERR_INTERNAL;
  } catch (const std::exception& error) {
    last_error = error.what();
    return LOCKSTEP_ERR_INTERNAL;
  } catch (...) {
    last_error = "an unknown exception";
    return LOCKSTEP_ERR_INTERNAL;
  }
}

const char* dtype_name(lockstep_dtype dtype) {
  switch (dtype) {
    case LOCKSTEP_FLOAT32: return "LOCKSTEP_FLOAT32";
    case LOCKSTEP_FLOAT64: return "LOCKSTEP_FLOAT64";
    case LOCKSTEP_INT32: return "LOCKSTEP_INT32";
    case LOCKSTEP_INT64: return "LOCKSTEP_INT64";
  }
  return "an unknown dtype";
}

torch::ScalarType scalar_type(lockstep_dtype dtype, const std::string& what) {
  switch (dtype) {
    case LOCKSTEP_FLOAT32: return torch::kFloat;
    case LOCKSTEP_FLOAT64: return torch::kDouble;
    case LOCKSTEP_INT32: return torch::kInt;
    case LOCKSTEP_INT64: return torch::kLong;
  }
  throw ArgumentError(str_cat(what, ": dtype ", static_cast<int>(dtype),
                              " is none of LOCKSTEP_FLOAT32, LOCKSTEP_FLOAT64, LOCKSTEP_INT32, LOCKSTEP_INT64"));
}

// The caller's array as a tensor over its memory (no copy). `what` names the
// argument ("lockstep_train_step: input").
torch::Tensor view_of(const lockstep_tensor* tensor, const std::string& what) {
  if (tensor == nullptr) throw ArgumentError(what + " is null");
  if (tensor->data == nullptr) throw ArgumentError(what + ": data is null");
  if (tensor->ndim < 0 || tensor->ndim > 16) {
    throw ArgumentError(str_cat(what, ": ndim must be between 0 and 16, got ", tensor->ndim));
  }
  if (tensor->ndim > 0 && tensor->shape == nullptr) throw ArgumentError(what + ": shape is null");
  std::vector<int64_t> sizes(tensor->shape, tensor->shape + tensor->ndim);
  for (int32_t d = 0; d < tensor->ndim; ++d) {
    if (sizes[static_cast<size_t>(d)] < 0) {
      throw ArgumentError(str_cat(what, ": shape[", d, "] is negative (", sizes[static_cast<size_t>(d)], ")"));
    }
  }
  torch::TensorOptions options = torch::TensorOptions().dtype(scalar_type(tensor->dtype, what));
  if (tensor->device >= 0) {
    if (!torch::cuda::is_available() || tensor->device >= static_cast<int32_t>(torch::cuda::device_count())) {
      throw ArgumentError(str_cat(what, ": device ", tensor->device, " is not a CUDA device of this process (",
                                  torch::cuda::is_available() ? torch::cuda::device_count() : 0,
                                  " visible); -1 means host memory"));
    }
    options = options.device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(tensor->device)));
  } else if (tensor->device != -1) {
    throw ArgumentError(str_cat(what, ": device must be -1 (host) or a CUDA index, got ", tensor->device));
  }
  return torch::from_blob(tensor->data, sizes, options);
}

std::string checked_string(const char* text, const std::string& what) {
  if (text == nullptr) throw ArgumentError(what + " is null");
  if (*text == '\0') throw ArgumentError(what + " is empty");
  return text;
}

// The floating-point dtype the model computes in: its parameters' (float32
// for a model without floating-point parameters).
torch::ScalarType compute_dtype(const Model& model) {
  for (const auto& parameter : model.parameters()) {
    if (parameter.is_floating_point()) return parameter.scalar_type();
  }
  return torch::kFloat;
}

// Note [The C API meets arrays as they are]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A simulation code holds real(8) fields and integer(4) indices; the model
// computes in its parameters' dtype (float32, mostly) and PyTorch's losses
// take int64 class indices. So a floating-point array of another dtype than
// the model's is converted to the model's, and an int32 array to int64, in one
// copy each; an array already in the right dtype is read where it lies. A
// float64 array of values that float32 holds exactly trains bitwise as the
// float32 array would (tests/capi: capi_train's float64 and real(8) runs).
torch::Tensor as_model_expects(torch::Tensor tensor, torch::ScalarType floating) {
  if (tensor.is_floating_point() && tensor.scalar_type() != floating) return tensor.to(floating);
  if (tensor.scalar_type() == torch::kInt) return tensor.to(torch::kLong);
  return tensor;
}

Batch batch_of(StepTrainer& trainer, const lockstep_tensor* input, const lockstep_tensor* target,
               const char* function) {
  const Model::TensorKeys keys = trainer.model().tensor_keys();
  const torch::ScalarType floating = compute_dtype(trainer.model());
  Batch batch;
  batch.set(keys.input, as_model_expects(view_of(input, str_cat(function, ": input")), floating));
  if (target != nullptr || std::string(function) == "lockstep_train_step") {
    batch.set(keys.target, as_model_expects(view_of(target, str_cat(function, ": target")), floating));
  }
  return batch;
}

// Whether a prediction of dtype `from` may be written into an array of dtype
// `to`: floating point into floating point (a float64 output takes a float32
// prediction), integers into integers; nothing across.
bool writable_as(torch::ScalarType from, torch::ScalarType to) {
  return c10::isFloatingType(from) == c10::isFloatingType(to) &&
         c10::isIntegralType(from, /*includeBool=*/false) == c10::isIntegralType(to, /*includeBool=*/false);
}

}  // namespace

lockstep_status create_trainer(const char* config_path, const char* const* overrides, int32_t count,
                               lockstep_trainer* out, const std::function<void()>& before) {
  if (out != nullptr) *out = nullptr;
  std::unique_ptr<lockstep_trainer_s> handle;
  // A config that cannot be read is an IO failure; one that reads but says
  // something wrong (or names a missing file inside) a CONFIG one.
  const lockstep_status read_status = guarded(LOCKSTEP_ERR_IO, [&] {
    if (out == nullptr) throw ArgumentError("lockstep_trainer_create: out is null");
    const std::string path = checked_string(config_path, "lockstep_trainer_create: config_path");
    if (count < 0) throw ArgumentError(str_cat("lockstep_trainer_create_with: count is negative (", count, ")"));
    if (count > 0 && overrides == nullptr) throw ArgumentError("lockstep_trainer_create_with: overrides is null");
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error)) {
      throw Error(str_cat("lockstep_trainer_create: cannot read the config file '", path, "'"));
    }
  });
  if (read_status != LOCKSTEP_OK) return read_status;
  if (before) {
    const lockstep_status started = guarded(LOCKSTEP_ERR_DISTRIBUTED, before);
    if (started != LOCKSTEP_OK) return started;
  }
  const lockstep_status status = guarded(LOCKSTEP_ERR_CONFIG, [&] {
    Config config = load_config(config_path);
    for (int32_t i = 0; i < count; ++i) {
      config.apply_override(checked_string(overrides[i], str_cat("lockstep_trainer_create_with: overrides[", i, "]")));
    }
    handle = std::make_unique<lockstep_trainer_s>();
    handle->trainer = std::make_unique<StepTrainer>(std::move(config));
  });
  if (status != LOCKSTEP_OK) return status;
  {
    std::lock_guard<std::mutex> lock(handles_mutex());
    live_handles().insert(handle.get());
  }
  *out = handle.release();
  return LOCKSTEP_OK;
}

}  // namespace lockstep

using lockstep::ArgumentError;
using lockstep::guarded;
using lockstep::str_cat;
using lockstep::trainer_of;

extern "C" {

lockstep_status lockstep_trainer_create(const char* config_path, lockstep_trainer* out) {
  return lockstep::create_trainer(config_path, nullptr, 0, out, nullptr);
}

lockstep_status lockstep_trainer_create_with(const char* config_path, const char* const* overrides, int32_t count,
                                             lockstep_trainer* out) {
  return lockstep::create_trainer(config_path, overrides, count, out, nullptr);
}

lockstep_status lockstep_train_step(lockstep_trainer handle, const lockstep_tensor* input,
                                    const lockstep_tensor* target, double* loss) {
  return guarded(LOCKSTEP_ERR_ARGUMENT, [&] {
    lockstep::StepTrainer& trainer = trainer_of(handle, "lockstep_train_step");
    lockstep::LogVars out = trainer.train_step(lockstep::batch_of(trainer, input, target, "lockstep_train_step"));
    if (loss != nullptr) *loss = out.count("loss") ? out.at("loss") : 0.0;
  });
}

lockstep_status lockstep_predict(lockstep_trainer handle, const lockstep_tensor* input, lockstep_tensor* output) {
  return guarded(LOCKSTEP_ERR_ARGUMENT, [&] {
    lockstep::StepTrainer& trainer = trainer_of(handle, "lockstep_predict");
    torch::Tensor destination = lockstep::view_of(output, "lockstep_predict: output");
    lockstep::Batch batch = lockstep::batch_of(trainer, input, nullptr, "lockstep_predict");
    const std::string key = trainer.model().tensor_keys().output;
    lockstep::Batch predicted = trainer.predict(batch);
    if (!predicted.contains(key)) {
      throw lockstep::Error(str_cat("lockstep_predict: the model's prediction has no '", key, "'"));
    }
    const torch::Tensor result = predicted.at(key);
    if (result.sizes() != destination.sizes()) {
      throw ArgumentError(str_cat("lockstep_predict: output has shape ", destination.sizes(),
                                  " but the prediction has shape ", result.sizes()));
    }
    if (!lockstep::writable_as(result.scalar_type(), destination.scalar_type())) {
      throw ArgumentError(str_cat("lockstep_predict: output has dtype ", lockstep::dtype_name(output->dtype),
                                  " but the prediction is ", result.scalar_type()));
    }
    torch::NoGradGuard no_grad;
    destination.copy_(result);
  });
}

lockstep_status lockstep_save_checkpoint(lockstep_trainer handle, const char* path) {
  return guarded(LOCKSTEP_ERR_IO, [&] {
    lockstep::StepTrainer& trainer = trainer_of(handle, "lockstep_save_checkpoint");
    trainer.save_checkpoint(lockstep::checked_string(path, "lockstep_save_checkpoint: path"));
  });
}

lockstep_status lockstep_load_checkpoint(lockstep_trainer handle, const char* path, int64_t* iteration) {
  return guarded(LOCKSTEP_ERR_IO, [&] {
    lockstep::StepTrainer& trainer = trainer_of(handle, "lockstep_load_checkpoint");
    const int64_t saved = trainer.load_checkpoint(lockstep::checked_string(path, "lockstep_load_checkpoint: path"));
    if (iteration != nullptr) *iteration = saved;
  });
}

lockstep_status lockstep_log_scalar(lockstep_trainer handle, const char* name, double value) {
  return guarded(LOCKSTEP_ERR_ARGUMENT, [&] {
    lockstep::StepTrainer& trainer = trainer_of(handle, "lockstep_log_scalar");
    trainer.log_scalar(lockstep::checked_string(name, "lockstep_log_scalar: name"), value);
  });
}

lockstep_status lockstep_trainer_iteration(lockstep_trainer handle, int64_t* iteration) {
  return guarded(LOCKSTEP_ERR_ARGUMENT, [&] {
    lockstep::StepTrainer& trainer = trainer_of(handle, "lockstep_trainer_iteration");
    if (iteration == nullptr) throw ArgumentError("lockstep_trainer_iteration: iteration is null");
    *iteration = trainer.iteration();
  });
}

lockstep_status lockstep_trainer_rank(lockstep_trainer handle, int32_t* rank, int32_t* world_size) {
  return guarded(LOCKSTEP_ERR_ARGUMENT, [&] {
    lockstep::StepTrainer& trainer = trainer_of(handle, "lockstep_trainer_rank");
    if (rank != nullptr) *rank = trainer.strategy().collectives()->rank();
    if (world_size != nullptr) *world_size = trainer.strategy().collectives()->world_size();
  });
}

lockstep_status lockstep_trainer_destroy(lockstep_trainer handle) {
  std::unique_ptr<lockstep_trainer_s> owned;
  const lockstep_status found = guarded(LOCKSTEP_ERR_ARGUMENT, [&] {
    trainer_of(handle, "lockstep_trainer_destroy");
    std::lock_guard<std::mutex> lock(lockstep::handles_mutex());
    lockstep::live_handles().erase(handle);
    owned.reset(handle);
  });
  if (found != LOCKSTEP_OK) return found;
  return guarded(LOCKSTEP_ERR_IO, [&] {
    lockstep::StepTrainer& trainer = *owned->trainer;
    if (!trainer.finished()) trainer.finish();
  });
}

const char* lockstep_last_error(void) { return lockstep::last_error.c_str(); }

}  // extern "C"
