// Trainer: the training loop, its hooks and its metrics.
//
// detectron2's TrainerBase + SimpleTrainer, driving an mmengine-style model
// step: each iteration takes the next batch (timing the wait as data_time),
// lets the model run its train_step with the optim wrapper, and writes the
// step's metrics into the EventStorage (gathered across ranks every
// gather_metric_period iterations). Its rooms: the loop and its phases here;
// the hooks and their points in HookList (hook_list.h); where the run ends
// and how ranks agree on an early end in RunStop (run_stop.h); the metrics'
// way into the storage in MetricsRecorder (metrics_recorder.h).
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
#include "lockstep/events/event_storage.h"
#include "lockstep/engine/hook.h"
#include "lockstep/engine/hook_list.h"
#include "lockstep/engine/metrics_recorder.h"
#include "lockstep/events/log_processor.h"
#include "lockstep/engine/run_stop.h"
#include "lockstep/optim/optim_wrapper.h"

namespace lockstep {

class DataLoader;
class Model;

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
  // Whose values the step metrics are and how writers smooth them
  // (events/log_processor.h): detectron2's unless set; the Runner sets
  // mmengine's (config key `log_processor`).
  TORCH_ARG(LogProcessor, log_processor) = LogProcessor::detectron2();
};

// Where a trainer's run is, moved by move_phase (each move asserted): idle
// outside begin() ... end(), between steps, or inside one iteration.
enum class TrainerPhase { kIdle, kBetweenSteps, kInStep };

class Trainer {
 public:
  // max_iter of a run without an end (core/step_metrics.h).
  static constexpr int64_t kNoEnd = lockstep::kNoEnd;

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
  void register_hooks(const std::vector<std::shared_ptr<Hook>>& hooks) { hooks_.add(hooks, *this); }
  // The hooks, in the order every hook point runs them; evaluation passes
  // call its eval points so that hooks see them.
  HookList& hooks() { return hooks_; }

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
  bool running() const { return phase_ != TrainerPhase::kIdle; }
  // One iteration's work on `batch`: the model's train_step, then its
  // metrics. Returns every logged value, read to the host, unless
  // `read_logged` is false (Note [Logged values read after the step]).
  LogVars run_batch(const Batch& batch, double data_time, bool read_logged = true);

  // Where the run ends: hooks request an early stop or a preemption stop
  // through it, and read whether the run was preempted.
  RunStop& stop() { return stop_; }
  const RunStop& stop() const { return stop_; }

  int64_t iter() const { return iter_; }
  // Training epochs as the data loader counts them.
  int64_t iters_per_epoch() const;
  int64_t epoch() const { return iter_ / iters_per_epoch(); }
  int64_t start_iter() const { return start_iter_; }
  int64_t max_iter() const { return stop_.max_iter(); }
  EventStorage& storage() { return storage_; }
  Model& model() const { return *model_; }
  // An error when the trainer has none (its batches come through step()).
  DataLoader& data_loader() const;
  bool has_data_loader() const { return data_loader_ != nullptr; }
  OptimWrapperBase& optim_wrapper() const { return *optim_wrapper_; }

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

 protected:
  // The hooks of one iteration around `body`; iter() moves on if it returns.
  void run_iteration(const std::function<void()>& body);
  // Logs the exception in flight and runs after_train, isolated; the run is
  // over. Call inside a catch.
  void fail_run();

 private:
  friend class RunStop;  // reads where the run is (phase_)

  std::shared_ptr<Model> model_;
  std::shared_ptr<DataLoader> data_loader_;
  std::shared_ptr<OptimWrapperBase> optim_wrapper_;
  TrainerOptions options_;
  HookList hooks_;
  EventStorage storage_;
  MetricsRecorder metrics_;
  std::unique_ptr<CudaGraphStep> cuda_graph_step_;  // with cuda_graph
  RunStop stop_{*this};
  int64_t iter_ = 0;
  int64_t start_iter_ = 0;
  int64_t resume_iteration_ = 0;
  TrainerPhase phase_ = TrainerPhase::kIdle;
};

}  // namespace lockstep
