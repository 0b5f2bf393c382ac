// Runner: a whole training run built from one config.
//
// mmengine's Runner, on lockstep's pieces: it reads the config, sets up the
// work directory, seeds, the strategy (single device, DDP, FSDP), model, data,
// optim wrapper, schedulers, evaluator and hooks, then trains with resume.
//
//   auto config = lockstep::load_config("examples/fashion_mnist/cnn.yaml");
//   lockstep::Runner runner(config, lockstep::RunnerOptions().work_dir("work_dirs/demo").resume(true));
//   runner.train();
//   auto metrics = runner.test();   // {"accuracy/top1": 0.91}
//
// Config sections read here: work_dir, randomness {seed, deterministic,
// diff_rank_seed}, env {num_threads}, strategy, model, train_dataloader,
// val_dataloader, test_dataloader, val_evaluator, test_evaluator, train_cfg
// {max_iters | max_epochs, val_interval, by_epoch}, optim_wrapper,
// param_scheduler, trainer {zero_grad_before_forward, gather_metric_period,
// async_write_metrics}, default_hooks, custom_hooks, load_from, resume,
// preemption (runner/preemption.h),
// activation_checkpointing {module_types}, cuda_graph {warmup_iters}
// (the whole step as one CUDA graph: engine/cuda_graph_step.h), log_processor
// (what is logged: runner/log_processor_config.h).
// Any other top-level key is an error naming its file and line (and the
// nearest known key); a program that reads top-level keys of its own names
// them in RunnerOptions::extra_config_keys.
#pragma once

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/core/stop_signals.h"
#include "lockstep/engine/checkpointer.h"
#include "lockstep/engine/trainer.h"

namespace lockstep {

class DataLoader;
class Model;
class Evaluator;
class Strategy;

struct RunnerOptions {
  // Overrides `work_dir` of the config when set.
  TORCH_ARG(std::string, work_dir) = "";
  // Resume from <work_dir>/last_checkpoint (or the newest good checkpoint).
  TORCH_ARG(bool, resume) = false;
  // Weights to start from (overrides `load_from`).
  TORCH_ARG(std::string, load_from) = "";
  // Top-level config keys the program reads itself (accepted besides the runner's own).
  TORCH_ARG(std::vector<std::string>, extra_config_keys);
  // A model built in code (e.g. a ModuleModel) instead of the config's `model`
  // section, which must then be absent.
  TORCH_ARG(std::shared_ptr<Model>, model);
};

// What a run decided about resuming, once for every rank, before it seeds
// anything (Note [One resume decision]): whether it resumes, and from which
// checkpoint, whose seed it then reuses. Runner::restore acts on it.
struct ResumePlan {
  bool resume = false;                     // --resume, `resume: true`, or a restart of the job
  std::optional<ResumeChoice> checkpoint;  // the checkpoint every rank loads; none: start from scratch
  std::optional<uint64_t> seed() const { return checkpoint ? checkpoint->seed : std::nullopt; }
};

class Runner {
 public:
  Runner(Config config, RunnerOptions options = RunnerOptions());
  ~Runner();

  // Trains to the end; returns the last validation metrics (empty without a val set).
  std::map<std::string, double> train();
  // For a program that owns its loop (see step_trainer.h): builds what
  // train() builds except the training data, resumes or loads weights as
  // train() does, and returns the trainer begun (before_train has run): the
  // caller feeds it with Trainer::step(batch) and closes it with
  // end_steps(). train_cfg may give max_iters (default: no end) and nothing
  // in epochs.
  Trainer& begin_steps();
  // Ends a run begun with begin_steps() as train() ends its own: the
  // trainer's end (after_train: the final checkpoint, the writers closed),
  // then every checkpoint save still in flight in the background, whole or
  // failed with its error here.
  void end_steps();
  // max_iters of a run fed through begin_steps() without one.
  static constexpr int64_t kNoEnd = Trainer::kNoEnd;
  // One pass over the val / test set with the current weights.
  std::map<std::string, double> val();
  std::map<std::string, double> test();

  const Config& config() const { return config_; }
  const std::string& work_dir() const { return work_dir_; }
  Strategy& strategy() const { return *strategy_; }
  std::shared_ptr<Strategy> strategy_ptr() const { return strategy_; }
  // The run's one checkpointer, built with its environment.
  Checkpointer& checkpointer() const;
  Trainer& trainer() const;
  uint64_t seed() const { return seed_; }
  // Whether train() stopped early for a stop signal, saved, and the process
  // should exit with kExitRequeue (runner/preemption.h).
  bool preempted() const { return trainer_ != nullptr && trainer_->stop().preempted(); }
  // For a run that failed before it began (the constructor, or StepTrainer's
  // begin_steps, the C API's create): closes this rank's log file and removes
  // the work dir this runner created, outermost new directory first, so that
  // a failed start leaves the working directory as it was. What existed
  // before is kept.
  void discard_new_work_dir();

 private:
  void setup_environment();
  void plan_resume();  // in setup_environment, once the checkpointer exists
  // Model, strategy, optim wrapper, schedulers, evaluation, checkpointer,
  // trainer and hooks; the training data loader only `with_train_data`.
  void build_for_training(bool with_train_data);
  // The model given in code (RunnerOptions::model) or built from `model`.
  std::shared_ptr<Model> build_model();
  // The training data loader, when `with_train_data`; returns its batches per
  // epoch (0 for a run fed through the step API, whose keys it checks).
  int64_t build_train_loader(bool with_train_data);
  // The default and custom hooks, with what they need to know of the run.
  void register_hooks(int64_t iters_per_epoch, int64_t val_interval, const LogProcessor& log_processor);
  // The data loader of `split` ("val", "test") with its evaluator, built from
  // <split>_dataloader and <split>_evaluator the first time it is asked for.
  DataLoader& eval_loader(const std::string& split);
  // Resumes as `plan` says (or loads load_from); returns the iteration to start from.
  int64_t restore(const ResumePlan& plan);
  std::map<std::string, double> evaluate(const std::string& split);
  // `activation_checkpointing: {module_types: [...]}`; true when it is on.
  bool apply_activation_checkpointing_config(Model& model);
  // The `cuda_graph` section's options, once the strategy and the optimizer
  // are known able to capture (an error naming the section and the reason
  // otherwise); turns the optimizer's device-side step on.
  CudaGraphOptions prepare_cuda_graph();

  Config config_;
  RunnerOptions options_;
  std::string work_dir_;
  std::string created_work_dir_;  // the outermost directory setup_environment made, if any
  std::string log_file_;          // this rank's, in the work dir
  uint64_t seed_ = 0;
  int64_t max_iters_ = 0;
  std::shared_ptr<Strategy> strategy_;
  std::shared_ptr<DataLoader> train_loader_;
  bool by_epoch_ = false;  // train_cfg counts epochs
  std::map<std::string, std::shared_ptr<DataLoader>> eval_loaders_;
  std::map<std::string, std::shared_ptr<Evaluator>> evaluators_;
  std::shared_ptr<Checkpointer> checkpointer_;
  // The checkpoint a resumed run continues from, once chosen (the seed needs
  // it before the data exists); nullopt: nothing to resume, or not chosen yet.
  ResumePlan resume_plan_;  // decided in setup_environment, acted on by restore()
  std::unique_ptr<Trainer> trainer_;
  std::map<std::string, double> last_val_metrics_;
  // Catches the preemption signals from train() until the runner goes away.
  std::unique_ptr<StopSignals> stop_signals_;
};

}  // namespace lockstep
