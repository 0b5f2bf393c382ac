// StepTrainer: training inside a program that owns its loop.
//
// A simulation (C, C++ or Fortran, under MPI or a launcher) that trains a
// surrogate or a closure model on the data it produces while it runs ("online"
// or "in-situ" training) cannot hand its loop to Runner::train(). A
// StepTrainer is the same run, one step at a time: built from the same YAML
// as `lockstep train` minus the data loaders (model, optim_wrapper,
// param_scheduler, strategy with DDP/FSDP/AMP, default_hooks, custom_hooks,
// work_dir, load_from, resume, randomness, env, trainer), each train_step is
// the Runner's iteration (autocast, forward, loss, backward with bucketed
// overlap, clipping, accumulation, optimizer step, schedulers, and the hooks:
// logger, metrics.jsonl and TensorBoard, EMA, and checkpoints: every
// default_hooks.checkpoint.interval iterations when the config gives one,
// otherwise only save_checkpoint's and the final one).
//
//   lockstep::StepTrainer trainer(lockstep::load_config("surrogate.yaml"));
//   for (int64_t t = 0; t < steps; ++t) {
//     advance(field);                                   // the program's own step
//     if (t % 10 == 0) {
//       lockstep::LogVars out = trainer.train_step({{"input", x}, {"target", y}});
//       trainer.log_scalar("residual", residual(field));
//     }
//   }
//   torch::Tensor y_hat = trainer.predict({{"input", x}}).at("output");
//   trainer.finish();                                   // final checkpoint, writers closed
//
//   // Or the network in code, the rest in the config (builtin_models/module_model.h):
//   auto model = std::make_shared<lockstep::ModuleModel>(net, lockstep::ModuleModelOptions().loss("mse"));
//   lockstep::StepTrainer trainer(model, lockstep::parse_config("optim_wrapper: {optimizer: {type: Adam}}"));
//
// What the API keeps for the caller (the traps of driving the pieces by hand):
//   - every step carries its iteration, which DDP and FSDP check across
//     ranks: a rank that skips or repeats a step is named on every rank;
//   - the accumulation window's position is the iteration's, on resume too;
//   - autocast (optim_wrapper.amp) is applied by train_step itself;
//   - collectives wait at most strategy.timeout_s, 300 s by default here
//     (lockstep train's default is 1800 s): a simulation's ranks call
//     train_step together, so a rank that stopped calling is found within
//     minutes, not half an hour.
//   - a step that fails on one rank is dropped on every rank under DDP and
//     every rank throws the same error (Note [Dropping a failed step]); the
//     program may catch it and go on.
//
// Collective (every rank calls it, in the same order): the constructor,
// train_step, predict, save_checkpoint, load_checkpoint, finish. A rank that
// makes another call than the others fails every rank at once, naming each
// rank's call (Note [Every rank makes the same call]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <c10/macros/Macros.h>

#include "lockstep/config/config.h"
#include "lockstep/core/step_metrics.h"
#include "lockstep/model/batch.h"
#include "lockstep/runner/runner.h"

namespace lockstep {

class Trainer;
class Strategy;
class Model;

// A StepTrainer's run is a Runner's: the same options (work_dir, resume,
// load_from, extra_config_keys, model).
using StepTrainerOptions = RunnerOptions;

class StepTrainer {
 public:
  // The collective timeout a StepTrainer gets when the config names none.
  static constexpr double kDefaultTimeoutS = 300;

  explicit StepTrainer(Config config, StepTrainerOptions options = StepTrainerOptions());
  // With a model built in code (a ModuleModel over any torch::nn::Module, or
  // a Model of the program's own); `config` holds the rest, without `model`.
  StepTrainer(std::shared_ptr<Model> model, Config config, StepTrainerOptions options = StepTrainerOptions());
  // Ends the run as finish() does, unless it was finished already (or an
  // exception is unwinding: then the run is left as it is).
  ~StepTrainer();
  C10_DISABLE_COPY_AND_ASSIGN(StepTrainer);

  // One iteration on `batch` (the model's batch keys, e.g. {"image", "label"}
  // for lockstep's classifiers, or the keys a TorchScriptModel is configured
  // with); returns its losses and metrics ("loss", ...). Throws on failure
  // without counting the iteration.
  LogVars train_step(const Batch& batch);
  // The model's predictions for `batch` (eval mode, no gradients); the model
  // goes back to training afterwards.
  Batch predict(const Batch& batch);
  // Writes a checkpoint of everything a bitwise resume needs. `name` is a
  // file name in the work dir ("model_0000100" -> <work_dir>/model_0000100.ckpt,
  // last_checkpoint points at it), or a path ending in ".ckpt". Returns the path.
  std::string save_checkpoint(const std::string& name);
  // Loads a checkpoint written by save_checkpoint (or by `lockstep train`)
  // into the model, optimizer, schedulers and hooks; the next train_step
  // continues from there. Returns the iteration it was written after.
  int64_t load_checkpoint(const std::string& path);
  // A scalar for the writers (console, metrics.jsonl, TensorBoard), at this
  // iteration.
  void log_scalar(const std::string& name, double value);
  // Ends the run: after_train (the final checkpoint, the writers' last write).
  void finish();

  // The iteration the next train_step runs.
  int64_t iteration() const;
  bool finished() const { return finished_; }
  Runner& runner() const { return *runner_; }
  Strategy& strategy() const;
  Model& model() const;
  Trainer& trainer() const { return *trainer_; }

 private:
  enum class Call { kTrainStep, kPredict, kSave, kLoad, kFinish };
  // Every rank makes this call as its same-numbered one (Note [Every rank makes the same call]).
  void agree_on_call(Call call);

  std::unique_ptr<Runner> runner_;
  Trainer* trainer_ = nullptr;
  bool finished_ = false;
  int64_t calls_ = 0;  // collective calls made so far
};

}  // namespace lockstep
