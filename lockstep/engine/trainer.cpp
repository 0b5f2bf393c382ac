#include "lockstep/engine/trainer.h"

#include <algorithm>
#include <chrono>

#include <ATen/record_function.h>
#include <cmath>
#include <exception>
#include <set>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/rng.h"
#include "lockstep/core/scalars_to_host.h"
#include "lockstep/data/data_loader.h"
#include "lockstep/model/log_values_on_device.h"
#include "lockstep/model/model.h"

namespace lockstep {

namespace {

// The edges of the run's phases (TrainerPhase).
void move_trainer_phase(TrainerPhase& phase, TrainerPhase to) {
  using Phase = TrainerPhase;
  constexpr unsigned kMayComeFrom[] = {
      kFromAny,                                                        // idle: end(), or a failure anywhere
      phase_bit(Phase::kIdle) | phase_bit(Phase::kInStep),            // between steps: begin(), an iteration's end
      phase_bit(Phase::kBetweenSteps),                                 // in a step
  };
  constexpr const char* kNames[] = {"idle", "between steps", "in a step"};
  move_phase("the trainer", phase, to, kMayComeFrom, kNames);
}

// The run is over: every hook's after_train runs, whatever an earlier one
// did: a hook that throws must not keep the final evaluation out of the
// writers, nor the writers from closing their files (detectron2 runs
// after_train in a `finally`). Metrics still in flight belong to the run:
// they are recorded before the writers close. The first error is rethrown
// once all have run.
void after_train(EventStorage& storage, MetricsRecorder& metrics, HookList& hooks, int64_t iteration) {
  storage.set_iter(iteration);
  std::exception_ptr first_error;
  try {
    metrics.flush();
  } catch (...) {
    first_error = std::current_exception();
  }
  hooks.after_train(first_error);
}

}  // namespace

Trainer::Trainer(std::shared_ptr<Model> model, std::shared_ptr<DataLoader> data_loader,
                 std::shared_ptr<OptimWrapperBase> optim_wrapper, TrainerOptions options, MetricsGatherer gather)
    : model_(std::move(model)),
      data_loader_(std::move(data_loader)),
      optim_wrapper_(std::move(optim_wrapper)),
      options_(options),
      metrics_(storage_, std::move(gather), options.gather_metric_period(), options.async_write_metrics(),
               options.log_processor().logs_main_rank_values()) {
  LOCKSTEP_CHECK(model_ != nullptr, "Trainer needs a model");
  LOCKSTEP_CHECK(optim_wrapper_ != nullptr, "Trainer needs an optim wrapper");
  // Its run stops at a non-finite loss: no rank steps from that iteration on
  // (Note [A non-finite loss stops before the step]).
  for (const auto& [name, wrapper] : optim_wrapper_->wrappers()) wrapper->stop_stepping_after_nonfinite_loss(true);
}

Trainer::~Trainer() = default;

int64_t Trainer::iters_per_epoch() const {
  // Without a data loader the run is one epoch (the caller's batches have no epochs).
  if (!data_loader_) return std::max<int64_t>(1, max_iter());
  return std::max<int64_t>(1, data_loader_->batches_per_epoch());
}

DataLoader& Trainer::data_loader() const {
  LOCKSTEP_CHECK(data_loader_ != nullptr, "this trainer has no data loader: its batches come through step()");
  return *data_loader_;
}

void Trainer::begin(int64_t start_iter, int64_t max_iter) {
  LOCKSTEP_CHECK(!running(), "begin(): the trainer is already running (call end() first)");
  LOCKSTEP_CHECK(start_iter >= 0 && start_iter <= max_iter, "train(start_iter=", start_iter,
                 ", max_iter=", max_iter, "): need 0 <= start_iter <= max_iter");
  hooks_.log_order();
  logger().info("Starting training from iteration {}", start_iter);
  iter_ = start_iter_ = start_iter;
  storage_.set_iter(start_iter);
  optim_wrapper_->initialize_count_status(start_iter, max_iter);
  if (options_.cuda_graph() && !cuda_graph_step_) cuda_graph_step_ = std::make_unique<CudaGraphStep>(*options_.cuda_graph());
  stop_.begin(max_iter, hooks_.stop_vote_intervals());
  move_trainer_phase(phase_, TrainerPhase::kBetweenSteps);
  try {
    hooks_.before_train();
    stop_.vote();
  } catch (...) {
    fail_run();
    throw;
  }
}

void Trainer::run_iteration(const std::function<void()>& body) {
  const int64_t per_epoch = iters_per_epoch();
  if (iter_ % per_epoch == 0) hooks_.before_train_epoch();
  move_trainer_phase(phase_, TrainerPhase::kInStep);
  try {
    // Hooks can see the iteration they are about to run through the storage.
    storage_.set_iter(iter_);
    hooks_.before_step();
    body();
    hooks_.after_step();
    if ((iter_ + 1) % per_epoch == 0) hooks_.after_train_epoch();
    stop_.vote();
  } catch (...) {
    move_trainer_phase(phase_, TrainerPhase::kBetweenSteps);
    throw;
  }
  move_trainer_phase(phase_, TrainerPhase::kBetweenSteps);
  ++iter_;
}

LogVars Trainer::step(const Batch& batch, double data_time) {
  LOCKSTEP_CHECK(running(), "step(): the trainer is not running (call begin() first)");
  LOCKSTEP_CHECK(iter_ < max_iter(), "step(): the run is over at iteration ", iter_, " of ", max_iter(),
                 stop_.stopped_early() ? " (a hook stopped it early)" : "");
  LogVars log_vars;
  run_iteration([&] { log_vars = run_batch(batch, data_time); });
  return log_vars;
}

void Trainer::continue_at(int64_t next_iteration) {
  LOCKSTEP_CHECK(phase_ == TrainerPhase::kBetweenSteps, "continue_at(", next_iteration, "): only between the steps of "
                 "a running trainer");
  LOCKSTEP_CHECK(next_iteration >= 0 && next_iteration <= max_iter(), "continue_at(", next_iteration,
                 "): outside the run's iterations [0, ", max_iter(), "]");
  iter_ = next_iteration;
  storage_.set_iter(iter_);
  optim_wrapper_->initialize_count_status(iter_, max_iter());
}

void Trainer::end() {
  LOCKSTEP_CHECK(running(), "end(): the trainer is not running");
  LOCKSTEP_CHECK(phase_ == TrainerPhase::kBetweenSteps,
                 "end(): called from inside a step (a hook?); end the run after it");
  move_trainer_phase(phase_, TrainerPhase::kIdle);
  // The caller ends its run here: hooks see it finished (final checkpoint,
  // final evaluation), as after a stop.
  stop_.end_at(iter_);
  after_train(storage_, metrics_, hooks_, iter_);
}

void Trainer::fail_run() {
  move_trainer_phase(phase_, TrainerPhase::kIdle);
  // The message goes into the log now, before after_train's hooks run: a
  // launcher that stops every worker when another one fails may end this
  // process before its error reaches the top (as detectron2 logs the trace).
  logger().error("Exception during training at iteration {}: {}", iter_, describe_exception(std::current_exception()));
  try {
    after_train(storage_, metrics_, hooks_, iter_);
  } catch (const std::exception& secondary) {
    logger().error("after_train also failed: {}", short_torch_message(secondary));
  }
}

void Trainer::train(int64_t start_iter, int64_t max_iter) {
  LOCKSTEP_CHECK(data_loader_ != nullptr, "train(): this trainer has no data loader; feed its batches with step()");
  begin(start_iter, max_iter);
  try {
    // max_iter() may shrink inside the loop (stop().request).
    while (iter_ < stop_.max_iter()) run_iteration([this] { run_step(); });
    // iter_ == max_iter now: hooks tell a finished run from a failed one by it.
  } catch (...) {
    fail_run();
    throw;
  }
  end();
}

void Trainer::run_step() {
  auto start = std::chrono::steady_clock::now();
  Batch batch;
  {
    RECORD_USER_SCOPE("lockstep::data");
    batch = data_loader().next();
  }
  // The logged values stay on the device except on the iterations whose metrics are recorded.
  run_batch(batch, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            metrics_.records(iter_));
}

namespace {
// The logged values' names for each optim wrapper's nonfinite_loss_iteration().
constexpr const char* kNonfiniteLossPrefix = "lockstep.nonfinite_loss_iteration/";

bool is_nonfinite_loss_mark(const std::string& name) { return name.rfind(kNonfiniteLossPrefix, 0) == 0; }

// The earliest iteration any wrapper saw a non-finite loss at, or -1.
int64_t first_nonfinite_loss_iteration(const LogVars& values) {
  int64_t first = -1;
  for (const auto& [name, value] : values) {
    if (!is_nonfinite_loss_mark(name) || value < 0) continue;
    const auto iteration = static_cast<int64_t>(value);
    first = first < 0 ? iteration : std::min(first, iteration);
  }
  return first;
}

LogVars without_nonfinite_loss_marks(LogVars values) {
  for (auto it = values.begin(); it != values.end();) it = is_nonfinite_loss_mark(it->first) ? values.erase(it) : std::next(it);
  return values;
}
}  // namespace

// Note [One training step, top to bottom]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What detectron2's run_step shows in one screen, lockstep's default path
// does in this order (each line where it is written):
//   data           run_step: data_loader().next()
//   zero_grad      run_batch, with zero_grad_before_forward (else after each step)
//   forward        Model::train_step: data_preprocessor, loss(), parse_losses
//   backward       OptimWrapper::backward: DDP/FSDP begin, loss.backward(), end
//   after_backward OptimWrapper::backward calls StepContext::after_backward,
//                  which is HookList::after_backward: every hook's after_backward
//   step           OptimWrapper::update_params: step() then zero_grad(), once
//                  every accumulative_counts backward passes
//   metrics        run_batch: MetricsRecorder::write
// The model owns forward-to-step (train_step) so that a model that overrides
// it (a GAN: two optimizers, two backward passes, in its own order) keeps its
// freedom; after_backward reaches the trainer's hooks through the
// StepContext callback for the same reason: the hooks run after every
// backward pass a train_step makes, not once per step.
LogVars Trainer::run_batch(const Batch& batch, double data_time, bool read_logged) {
  LOCKSTEP_CHECK(model_->is_training(), "the model is in eval mode at iteration ", iter_,
                 ": a hook switched it with eval() and did not switch it back with train()");
  if (options_.zero_grad_before_forward()) optim_wrapper_->zero_grad();
  // iter_ is the iteration DDP and FSDP check every rank reduces gradients
  // of (Note [The iteration check], Note [FSDP's step check]).
  StepContext step{iter_, [this] { hooks_.after_backward(); }};
  CudaGraphStep::Outputs outputs;
  if (cuda_graph_step_) {
    outputs = cuda_graph_step_->run(*model_, *optim_wrapper_, batch, step);
  } else {
    LogValuesOnDevice logged;
    outputs.returned = model_->run_train_step(batch, *optim_wrapper_, step);
    outputs.logged = logged.tensors();
  }
  // The logged losses and the optimizer's metrics live on the device: read
  // them together, in one copy, only when asked (Note [Logged values read
  // after the step]).
  LogVars log_vars = std::move(outputs.returned);
  if (read_logged) {
    std::map<std::string, torch::Tensor> on_device = std::move(outputs.logged);
    if (metrics_.records(iter_)) {
      for (auto& [name, tensor] : optim_wrapper_->last_update_metric_tensors()) on_device[name] = tensor;
      // Note [A non-finite loss stops before the step]: read in the same copy.
      for (auto& [name, wrapper] : optim_wrapper_->wrappers()) {
        if (wrapper->nonfinite_loss_iteration().defined()) {
          on_device[kNonfiniteLossPrefix + name] = wrapper->nonfinite_loss_iteration();
        }
      }
    }
    for (const auto& [name, value] : scalars_to_host(on_device)) log_vars[name] = value;
  }
  const int64_t nonfinite_loss_iteration = first_nonfinite_loss_iteration(log_vars);
  log_vars = without_nonfinite_loss_marks(std::move(log_vars));
  metrics_.write(log_vars, data_time, iter_, nonfinite_loss_iteration);
  return log_vars;
}

State Trainer::state() const {
  State state;
  state.values["iteration"] = iter_;
  // Where a resumed run goes on: after the iteration in progress (a hook's
  // save), or at iter() itself between iterations (a save by the caller of
  // step(), or after the run). Checkpoints without it go on after "iteration".
  state.values["next_iteration"] = phase_ == TrainerPhase::kInStep ? iter_ + 1 : iter_;
  state.put("hooks", hooks_.state());
  if (data_loader_) state.put("data_loader", data_loader_->state());
  state.put("rng", capture_rng_state());
  hooks_.before_save_checkpoint(state);
  return state;
}

void Trainer::load_state(const State& state) {
  LOCKSTEP_CHECK(state.values.contains("iteration"), "the trainer state in the checkpoint has no iteration");
  iter_ = state.values.at("iteration").get<int64_t>();
  resume_iteration_ = state.values.value("next_iteration", iter_ + 1);
  hooks_.load_state(state.get("hooks"));
  if (state.contains("data_loader") && data_loader_) {
    data_loader_->load_state(state.get("data_loader"));
  } else if (data_loader_ && data_loader_->batches_per_epoch() > 0) {
    // A checkpoint without the loader's position (PyTorch's DCP, Note
    // [Resuming from PyTorch's DCP]): its batches up to the resumed iteration
    // were taken, as mmengine's loop advances its iterator on resume.
    State position;
    position.values = {{"epoch", resume_iteration_ / data_loader_->batches_per_epoch()},
                       {"batch_in_epoch", resume_iteration_ % data_loader_->batches_per_epoch()}};
    data_loader_->load_state(position);
  }
  if (state.contains("rng")) restore_rng_state(state.get("rng"));
  hooks_.after_load_checkpoint(state);
}

}  // namespace lockstep
