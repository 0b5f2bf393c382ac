// Trainer: the training loop, its hooks and its metrics.
//
// detectron2's TrainerBase + SimpleTrainer, driving an mmengine-style model
// step: each iteration takes the next batch (timing the wait as data_time),
// lets the model run its train_step with the optim wrapper, and writes the
// step's metrics into the EventStorage (gathered across ranks every
// gather_metric_period iterations).
//
//   lockstep::Trainer trainer(model, loader, optim_wrapper,
//                             lockstep::TrainerOptions().gather_metric_period(1));
//   trainer.register_hooks({timer, lr_hook, checkpointer, writer});
//   trainer.train(/*start_iter=*/0, /*max_iter=*/1000);
//   // trainer.iter() == 1000 here; after_train ran even if a step threw.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/macros/Macros.h>

#include "lockstep/core/state.h"
#include "lockstep/engine/cuda_graph_step.h"
#include "lockstep/engine/event_storage.h"
#include "lockstep/engine/hook.h"
#include "lockstep/optim/optim_wrapper.h"

namespace lockstep {

class DataLoader;
class Model;
class OrderedWorker;

struct TrainerOptions {
  // Zero gradients before the forward pass as well (the optim wrapper always
  // zeroes them after an update).
  TORCH_ARG(bool, zero_grad_before_forward) = false;
  // Gather and record step metrics every N iterations.
  TORCH_ARG(int64_t, gather_metric_period) = 1;
  // Record metrics on one ordered background thread, off the step's path.
  TORCH_ARG(bool, async_write_metrics) = false;
  // The whole step as one CUDA graph (engine/cuda_graph_step.h); unset: eager.
  TORCH_ARG(std::optional<CudaGraphOptions>, cuda_graph) = std::nullopt;
};

class Trainer {
 public:
  // max_iter of a run without an end (a program that trains as it goes):
  // large, and far from overflowing when counted up to.
  static constexpr int64_t kNoEnd = std::numeric_limits<int64_t>::max() / 4;

  // `gather` collects step metrics from every rank (Collectives::metrics_gatherer);
  // null: this process's only. `data_loader` null: the batches come through
  // step(), and the run is one epoch.
  Trainer(std::shared_ptr<Model> model, std::shared_ptr<DataLoader> data_loader,
          std::shared_ptr<OptimWrapperBase> optim_wrapper, TrainerOptions options = TrainerOptions(),
          MetricsGatherer gather = nullptr);
  virtual ~Trainer();
  C10_DISABLE_COPY_AND_ASSIGN(Trainer);

  // Adds hooks (null and inactive ones are skipped: Hook::active) by
  // priority, after those of equal priority already registered, and attaches
  // them to this trainer.
  void register_hooks(const std::vector<std::shared_ptr<Hook>>& hooks);
  const std::vector<std::shared_ptr<Hook>>& hooks() const { return hooks_; }

  // Runs iterations [start_iter, max_iter) on the data loader's batches.
  // after_train always runs; on success iter() == max_iter afterwards.
  void train(int64_t start_iter, int64_t max_iter);
  // The data loader's next batch through run_batch (detectron2's run_step;
  // override to change what one iteration does).
  virtual void run_step();

  // A run whose loop is the caller's (lockstep::StepTrainer), the same run
  // train() makes: begin() once (before_train), step(batch) per iteration
  // (the iteration's hooks around the model's train_step on `batch`; returns
  // its losses and metrics), end() once (after_train). A step that throws is
  // not counted: iter() stays, and the caller may step again.
  void begin(int64_t start_iter, int64_t max_iter);
  LogVars step(const Batch& batch, double data_time = 0);
  void end();
  bool running() const { return phase_ != Phase::kIdle; }
  // One iteration's work on `batch`: the model's train_step, then its
  // metrics. Returns every logged value (it reads them all to the host).
  LogVars run_batch(const Batch& batch, double data_time);

  // Ends the run after the current iteration (before the first, when asked
  // from before_train). Hooks then see a finished run: iter() reaches
  // max_iter(). In a distributed run (set_stop_agreement) every rank stops at
  // the same iteration: after each iteration the ranks agree whether any of
  // them asked, which they do when a registered hook declares
  // may_request_stop(); a request without such a hook is an error, since the
  // other ranks would train on alone.
  void request_stop(const std::string& reason);
  // A stop because the job is being preempted (a scheduler's signal,
  // hooks/preemption_hook.h). In a distributed run it is a vote: the ranks
  // stop after the iteration at which they agree (Note [Stopping for a
  // preemption]), and preempted() is then true on every rank, so that hooks
  // save a checkpoint to resume from instead of a final one. On the run's
  // last iteration it is ignored: the run finishes.
  void request_preemption_stop(const std::string& reason);
  bool preempted() const { return preempted_; }
  // How ranks agree on a stop: true when `local` is true on any rank
  // (Collectives::any_rank). Unset: one process, nothing to agree.
  void set_stop_agreement(std::function<bool(bool)> any_rank) { stop_agreement_ = std::move(any_rank); }
  bool stopped_early() const { return stopped_early_; }

  // Evaluation passes call these so that hooks see them (mmengine's
  // val/test loop points); `test` selects the test_* hook points.
  void before_eval_epoch(bool test);
  void after_eval_epoch(bool test, const std::map<std::string, double>& metrics);
  void before_eval_iter(bool test, int64_t batch_index, const Batch& batch);
  void after_eval_iter(bool test, int64_t batch_index, const Batch& batch, const Batch& outputs);

  int64_t iter() const { return iter_; }
  // Training epochs as the data loader counts them.
  int64_t iters_per_epoch() const;
  int64_t epoch() const { return iter_ / iters_per_epoch(); }
  int64_t start_iter() const { return start_iter_; }
  int64_t max_iter() const { return max_iter_; }
  EventStorage& storage() { return storage_; }
  Model& model() const { return *model_; }
  std::shared_ptr<Model> model_ptr() const { return model_; }
  // An error when the trainer has none (its batches come through step()).
  DataLoader& data_loader() const;
  bool has_data_loader() const { return data_loader_ != nullptr; }
  OptimWrapperBase& optim_wrapper() const { return *optim_wrapper_; }
  const TrainerOptions& options() const { return options_; }

  // Replaces the data loader (detectron2's reset_data_loader); the old one is
  // destroyed first so its workers stop before new ones start.
  void reset_data_loader(const std::function<std::shared_ptr<DataLoader>()>& build);

  // {iteration, next_iteration, hooks: {name: state}, data_loader, rng}
  State state() const;
  // Restores what state() saved; warns about hook states no hook claims.
  // iter() is then the saved iteration and resume_iteration() the one a
  // resumed run starts at.
  void load_state(const State& state);
  int64_t resume_iteration() const { return resume_iteration_; }
  // Between the steps of a running trainer (begin() ... end()): the next
  // step() runs iteration `next_iteration` (after load_state, resume_iteration()),
  // with the accumulation window where that iteration sits.
  void continue_at(int64_t next_iteration);

  // Records one step's metrics (see class comment). Public for custom run_step overrides.
  void write_metrics(const LogVars& log_vars, double data_time, int64_t iteration);
  // The CUDA graph the steps run through (TrainerOptions::cuda_graph), or null.
  const CudaGraphStep* cuda_graph_step() const { return cuda_graph_step_.get(); }
  // Whether `iteration`'s metrics are gathered and written (every gather_metric_period).
  bool records_metrics(int64_t iteration) const { return (iteration + 1) % options_.gather_metric_period() == 0; }
  // Waits for metrics queued by async_write_metrics and rethrows their error, if any.
  void flush_metrics();

 protected:
  void before_train();
  // The hooks of one iteration around `body`; iter() moves on if it returns.
  void run_iteration(const std::function<void()>& body);
  // after_train after a failure, isolated; the run is over.
  void fail_run();
  void after_train();
  void before_step();
  void after_backward();
  void after_step();
  void log_hook_order() const;

 private:
  // run_batch, reading the logged values to the host only when `read_logged`
  // (Note [Logged values read after the step]).
  LogVars train_on(const Batch& batch, double data_time, bool read_logged);
  void record_metrics(const LogVars& log_vars, double data_time, int64_t iteration);

  std::shared_ptr<Model> model_;
  std::shared_ptr<DataLoader> data_loader_;
  std::shared_ptr<OptimWrapperBase> optim_wrapper_;
  TrainerOptions options_;
  std::vector<std::shared_ptr<Hook>> hooks_;
  EventStorage storage_;
  MetricsGatherer gather_metrics_;
  std::unique_ptr<OrderedWorker> metrics_worker_;  // with async_write_metrics (lockstep/core/ordered_worker.h)
  std::unique_ptr<CudaGraphStep> cuda_graph_step_;  // with cuda_graph
  int64_t iter_ = 0;
  int64_t start_iter_ = 0;
  int64_t max_iter_ = 0;
  bool stopped_early_ = false;
  // Where the run is, moved by move_phase (each move asserted): idle outside
  // begin() ... end(), between steps, or inside one iteration.
  enum class Phase { kIdle, kBetweenSteps, kInStep };
  Phase phase_ = Phase::kIdle;
  void move_to(Phase to);
  int64_t resume_iteration_ = 0;
  std::function<bool(bool)> stop_agreement_;
  bool votes_on_stops_ = false;        // a registered hook may request a stop (set by train())
  std::vector<int64_t> vote_intervals_;  // of the hooks that may request a stop
  bool stop_requested_here_ = false;   // this rank asked since the last vote
  bool preemption_requested_here_ = false;
  bool preempted_ = false;
  // After each iteration (and after before_train): whether any rank asked to stop.
  void agree_on_stop();
  void stop_for_preemption(const std::string& reason);
};

}  // namespace lockstep
