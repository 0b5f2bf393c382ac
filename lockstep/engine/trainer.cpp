#include "lockstep/engine/trainer.h"

#include <algorithm>
#include <chrono>

#include <ATen/record_function.h>
#include <cmath>
#include <set>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/core/internal/internal_error.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/ordered_worker.h"
#include "lockstep/core/rng.h"
#include "lockstep/core/scalars_to_host.h"
#include "lockstep/data/data_loader.h"
#include "lockstep/model/log_values_on_device.h"
#include "lockstep/model/model.h"

namespace lockstep {

// The metrics writer's bounds: a queue of 16 gathers is far ahead of any
// writer, and a gather that has not returned within 30 minutes (the process
// groups' own default timeout) waits for a rank that will not come.
constexpr int kMetricsQueueCapacity = 16;
constexpr double kMetricsWaitLimitSeconds = 1800;

Trainer::Trainer(std::shared_ptr<Model> model, std::shared_ptr<DataLoader> data_loader,
                 std::shared_ptr<OptimWrapperBase> optim_wrapper, TrainerOptions options, MetricsGatherer gather)
    : model_(std::move(model)),
      data_loader_(std::move(data_loader)),
      optim_wrapper_(std::move(optim_wrapper)),
      options_(options),
      gather_metrics_(std::move(gather)) {
  LOCKSTEP_CHECK(model_ != nullptr, "Trainer needs a model");
  LOCKSTEP_CHECK(optim_wrapper_ != nullptr, "Trainer needs an optim wrapper");
  LOCKSTEP_CHECK(options_.gather_metric_period() >= 1, "gather_metric_period must be at least 1, got ",
                 options_.gather_metric_period());
  if (!gather_metrics_) gather_metrics_ = [](const LogVars& local) { return std::vector<LogVars>{local}; };
  if (options_.async_write_metrics()) {
    metrics_worker_ =
        std::make_unique<OrderedWorker>("metrics writer", kMetricsQueueCapacity, kMetricsWaitLimitSeconds);
  }
}

Trainer::~Trainer() = default;

void Trainer::register_hooks(const std::vector<std::shared_ptr<Hook>>& hooks) {
  for (const auto& hook : hooks) {
    if (!hook || !hook->active()) continue;
    LOCKSTEP_CHECK(hook->trainer_ == nullptr || hook->trainer_ == this, "hook '", hook->name(),
                   "' is already registered with another trainer");
    hook->trainer_ = this;
    // After every hook of the same or a higher priority (a lower number).
    auto position = std::find_if(hooks_.begin(), hooks_.end(),
                                 [&](const std::shared_ptr<Hook>& other) { return other->priority() > hook->priority(); });
    hooks_.insert(position, hook);
  }
}

void Trainer::log_hook_order() const {
  std::string text;
  for (const auto& hook : hooks_) text += fmt::format("\n  ({:<12}) {}", hook_priority_name(hook->priority()), hook->name());
  logger().info("Hooks, in the order every stage runs them:{}", text);
}

int64_t Trainer::iters_per_epoch() const {
  // Without a data loader the run is one epoch (the caller's batches have no epochs).
  if (!data_loader_) return std::max<int64_t>(1, max_iter_);
  return std::max<int64_t>(1, data_loader_->batches_per_epoch());
}

DataLoader& Trainer::data_loader() const {
  LOCKSTEP_CHECK(data_loader_ != nullptr, "this trainer has no data loader: its batches come through step()");
  return *data_loader_;
}

void Trainer::request_stop(const std::string& reason) {
  LOCKSTEP_CHECK(!stop_agreement_ || votes_on_stops_, "request_stop(\"", reason, "\") at iteration ", iter_,
                 " of a distributed run, but no registered hook declares may_request_stop(): the ranks agree on "
                 "stops only then, and without that this rank would stop alone while the others train on. Override "
                 "may_request_stop() to return true in the hook that stops (EarlyStoppingHook does).");
  stop_requested_here_ = true;
  const int64_t last = phase_ == Phase::kInStep ? iter_ + 1 : iter_;
  if (stopped_early_ && max_iter_ <= last) return;
  if (phase_ == Phase::kInStep) {
    logger().info("Stopping training after iteration {}: {}", iter_, reason);
  } else {
    logger().info("Stopping training before iteration {}: {}", iter_, reason);
  }
  stopped_early_ = true;
  max_iter_ = std::min(max_iter_, last);
}

void Trainer::request_preemption_stop(const std::string& reason) {
  LOCKSTEP_CHECK(!stop_agreement_ || votes_on_stops_, "request_preemption_stop(\"", reason, "\") at iteration ", iter_,
                 " of a distributed run, but no registered hook declares may_request_stop()");
  if (preemption_requested_here_ || preempted_) return;
  preemption_requested_here_ = true;
  if (stop_agreement_) {
    logger().info("{}: stopping at the iteration every rank agrees on, to save and exit", reason);
    return;
  }
  // One process: nothing to agree, the stop is now.
  stop_for_preemption(reason);
}

void Trainer::stop_for_preemption(const std::string& reason) {
  // On the last iteration the run simply finishes.
  const int64_t last = phase_ == Phase::kInStep ? iter_ + 1 : iter_;
  if (last >= max_iter_) return;
  preempted_ = true;
  request_stop(reason + "; saving to resume later");
}

void Trainer::agree_on_stop() {
  if (!votes_on_stops_) return;
  if (phase_ == Phase::kInStep && std::none_of(vote_intervals_.begin(), vote_intervals_.end(),
                                    [this](int64_t every) { return (iter_ + 1) % every == 0; })) {
    return;  // no vote at this iteration: a request waits for the next
  }
  const bool stop_here = stop_requested_here_;
  const bool preemption_here = preemption_requested_here_;
  stop_requested_here_ = false;
  // Note [Stopping for a preemption]: a rank's signal is a vote, not a stop:
  // the signal reaches the ranks up to an iteration apart, and hooks that
  // save (collectively) must see the same run on every rank. A second vote,
  // only on the iteration that stops, tells a preemption from an early stop.
  if (!stop_agreement_(stop_here || preemption_here)) return;
  const bool preemption_anywhere = stop_agreement_(preemption_here);
  if (preemption_anywhere) {
    stop_for_preemption(preemption_here ? "stop signal received" : "another rank received a stop signal");
  } else if (!stop_here) {
    request_stop("another rank asked to stop at this iteration");
  }
  stop_requested_here_ = false;
}

void Trainer::before_eval_epoch(bool test) {
  for (auto& hook : hooks_) test ? hook->before_test_epoch() : hook->before_val_epoch();
}

void Trainer::after_eval_epoch(bool test, const std::map<std::string, double>& metrics) {
  for (auto& hook : hooks_) test ? hook->after_test_epoch(metrics) : hook->after_val_epoch(metrics);
}

void Trainer::before_eval_iter(bool test, int64_t batch_index, const Batch& batch) {
  for (auto& hook : hooks_) {
    test ? hook->before_test_iter(batch_index, batch) : hook->before_val_iter(batch_index, batch);
  }
}

void Trainer::after_eval_iter(bool test, int64_t batch_index, const Batch& batch, const Batch& outputs) {
  for (auto& hook : hooks_) {
    test ? hook->after_test_iter(batch_index, batch, outputs) : hook->after_val_iter(batch_index, batch, outputs);
  }
}

void Trainer::move_to(Phase to) {
  constexpr unsigned kMayComeFrom[] = {
      kFromAny,                                                        // idle: end(), or a failure anywhere
      phase_bit(Phase::kIdle) | phase_bit(Phase::kInStep),            // between steps: begin(), an iteration's end
      phase_bit(Phase::kBetweenSteps),                                 // in a step
  };
  constexpr const char* kNames[] = {"idle", "between steps", "in a step"};
  move_phase("the trainer", phase_, to, kMayComeFrom, kNames);
}

void Trainer::begin(int64_t start_iter, int64_t max_iter) {
  LOCKSTEP_CHECK(!running(), "begin(): the trainer is already running (call end() first)");
  LOCKSTEP_CHECK(start_iter >= 0 && start_iter <= max_iter, "train(start_iter=", start_iter,
                 ", max_iter=", max_iter, "): need 0 <= start_iter <= max_iter");
  log_hook_order();
  logger().info("Starting training from iteration {}", start_iter);
  iter_ = start_iter_ = start_iter;
  max_iter_ = max_iter;
  stopped_early_ = false;
  storage_.set_iter(start_iter);
  optim_wrapper_->initialize_count_status(start_iter, max_iter);
  if (options_.cuda_graph() && !cuda_graph_step_) cuda_graph_step_ = std::make_unique<CudaGraphStep>(*options_.cuda_graph());
  votes_on_stops_ = stop_agreement_ && std::any_of(hooks_.begin(), hooks_.end(), [](const std::shared_ptr<Hook>& hook) {
                      return hook->may_request_stop();
                    });
  stop_requested_here_ = preemption_requested_here_ = preempted_ = false;
  vote_intervals_.clear();
  for (const auto& hook : hooks_) {
    if (!hook->may_request_stop()) continue;
    LOCKSTEP_CHECK(hook->stop_vote_interval() >= 1, "hook ", hook->name(), ": stop_vote_interval() must be at least 1");
    vote_intervals_.push_back(hook->stop_vote_interval());
  }
  move_to(Phase::kBetweenSteps);
  try {
    before_train();
    agree_on_stop();
  } catch (...) {
    fail_run();
    throw;
  }
}

void Trainer::run_iteration(const std::function<void()>& body) {
  const int64_t per_epoch = iters_per_epoch();
  if (iter_ % per_epoch == 0) {
    for (auto& hook : hooks_) hook->before_train_epoch();
  }
  move_to(Phase::kInStep);
  try {
    before_step();
    body();
    after_step();
    if ((iter_ + 1) % per_epoch == 0) {
      for (auto& hook : hooks_) hook->after_train_epoch();
    }
    agree_on_stop();
  } catch (...) {
    move_to(Phase::kBetweenSteps);
    throw;
  }
  move_to(Phase::kBetweenSteps);
  ++iter_;
}

LogVars Trainer::step(const Batch& batch, double data_time) {
  LOCKSTEP_CHECK(running(), "step(): the trainer is not running (call begin() first)");
  LOCKSTEP_CHECK(iter_ < max_iter_, "step(): the run is over at iteration ", iter_, " of ", max_iter_,
                 stopped_early_ ? " (a hook stopped it early)" : "");
  LogVars log_vars;
  run_iteration([&] { log_vars = run_batch(batch, data_time); });
  return log_vars;
}

void Trainer::continue_at(int64_t next_iteration) {
  LOCKSTEP_CHECK(phase_ == Phase::kBetweenSteps, "continue_at(", next_iteration, "): only between the steps of a running "
                 "trainer");
  LOCKSTEP_CHECK(next_iteration >= 0 && next_iteration <= max_iter_, "continue_at(", next_iteration,
                 "): outside the run's iterations [0, ", max_iter_, "]");
  iter_ = next_iteration;
  storage_.set_iter(iter_);
  optim_wrapper_->initialize_count_status(iter_, max_iter_);
}

void Trainer::end() {
  LOCKSTEP_CHECK(running(), "end(): the trainer is not running");
  LOCKSTEP_CHECK(phase_ == Phase::kBetweenSteps, "end(): called from inside a step (a hook?); end the run after it");
  move_to(Phase::kIdle);
  // The caller ends its run here: hooks see it finished (final checkpoint,
  // final evaluation), as after a stop.
  if (iter_ < max_iter_) {
    stopped_early_ = true;
    max_iter_ = iter_;
  }
  after_train();
}

void Trainer::fail_run() {
  move_to(Phase::kIdle);
  logger().error("Exception during training at iteration {}", iter_);
  try {
    after_train();
  } catch (const std::exception& secondary) {
    logger().error("after_train also failed: {}", short_torch_message(secondary));
  }
}

void Trainer::train(int64_t start_iter, int64_t max_iter) {
  LOCKSTEP_CHECK(data_loader_ != nullptr, "train(): this trainer has no data loader; feed its batches with step()");
  begin(start_iter, max_iter);
  try {
    // max_iter_ may shrink inside the loop (request_stop).
    while (iter_ < max_iter_) run_iteration([this] { run_step(); });
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
  train_on(batch, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
           records_metrics(iter_));
}

// Note [One training step, top to bottom]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What detectron2's run_step shows in one screen, lockstep's default path
// does in this order (each line where it is written):
//   data           run_step: data_loader().next()
//   zero_grad      run_batch, with zero_grad_before_forward (else after each step)
//   forward        Model::train_step: data_preprocessor, loss(), parse_losses
//   backward       OptimWrapper::backward: DDP/FSDP begin, loss.backward(), end
//   after_backward OptimWrapper::backward calls StepContext::after_backward,
//                  which is Trainer::after_backward: every hook's after_backward
//   step           OptimWrapper::update_params: step() then zero_grad(), once
//                  every accumulative_counts backward passes
//   metrics        run_batch: write_metrics
// The model owns forward-to-step (train_step) so that a model that overrides
// it (a GAN: two optimizers, two backward passes, in its own order) keeps its
// freedom; after_backward reaches the trainer's hooks through the
// StepContext callback for the same reason: the hooks run after every
// backward pass a train_step makes, not once per step.
LogVars Trainer::run_batch(const Batch& batch, double data_time) {
  return train_on(batch, data_time, /*read_logged=*/true);
}

LogVars Trainer::train_on(const Batch& batch, double data_time, bool read_logged) {
  LOCKSTEP_CHECK(model_->is_training(), "the model is in eval mode at iteration ", iter_,
                 ": a hook switched it with eval() and did not switch it back with train()");
  if (options_.zero_grad_before_forward()) optim_wrapper_->zero_grad();
  // iter_ is the iteration DDP and FSDP check every rank reduces gradients
  // of (Note [The iteration check], Note [FSDP's step check]).
  StepContext step{iter_, [this] { after_backward(); }};
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
    if (records_metrics(iter_)) {
      for (auto& [name, tensor] : optim_wrapper_->last_update_metric_tensors()) on_device[name] = tensor;
    }
    for (const auto& [name, value] : scalars_to_host(on_device)) log_vars[name] = value;
  }
  write_metrics(log_vars, data_time, iter_);
  return log_vars;
}

void Trainer::write_metrics(const LogVars& log_vars, double data_time, int64_t iteration) {
  if (!records_metrics(iteration)) return;
  if (metrics_worker_) {
    metrics_worker_->rethrow_error();
    metrics_worker_->submit([this, log_vars, data_time, iteration] { record_metrics(log_vars, data_time, iteration); });
  } else {
    record_metrics(log_vars, data_time, iteration);
  }
}

void Trainer::record_metrics(const LogVars& log_vars, double data_time, int64_t iteration) {
  LogVars local = log_vars;
  local["data_time"] = data_time;
  storage_.put_scalar("rank_data_time", data_time, true, iteration);
  std::vector<LogVars> all = gather_metrics_(local);
  // The slowest rank's data time is what every rank waits for; the rest are averaged.
  double max_data_time = 0;
  LogVars mean;
  for (const auto& rank_metrics : all) {
    for (const auto& metric : rank_metrics) {
      if (metric.first == "data_time") {
        max_data_time = std::max(max_data_time, metric.second);
      } else {
        mean[metric.first] += metric.second / static_cast<double>(all.size());
      }
    }
  }
  auto total = mean.find("loss");
  if (total != mean.end() && !std::isfinite(total->second)) {
    std::ostringstream losses;
    for (const auto& metric : mean) losses << (losses.tellp() > 0 ? ", " : "") << metric.first << ": " << metric.second;
    LOCKSTEP_FAIL("Loss became infinite or NaN at iteration=", iteration, "!\nloss_dict = {", losses.str(), "}");
  }
  storage_.put_scalar("data_time", max_data_time, true, iteration);
  storage_.put_scalars(mean, true, iteration);
}

void Trainer::flush_metrics() {
  if (!metrics_worker_) return;
  metrics_worker_->drain();
  metrics_worker_->rethrow_error();
}

void Trainer::before_train() {
  for (auto& hook : hooks_) hook->before_train();
}

void Trainer::after_train() {
  storage_.set_iter(iter_);
  // Every hook's after_train runs, whatever an earlier one did: a hook that
  // throws must not keep the final evaluation out of the writers, nor the
  // writers from closing their files (detectron2 runs after_train in a
  // `finally`). The first error is rethrown once all have run.
  std::exception_ptr first_error;
  // Metrics still in flight belong to the run: record them before writers close.
  try {
    flush_metrics();
  } catch (...) {
    first_error = std::current_exception();
  }
  for (auto& hook : hooks_) {
    try {
      hook->after_train();
    } catch (...) {
      logger().error("Hook '{}' failed in after_train: {}", hook->name(), describe_exception(std::current_exception()));
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

void Trainer::before_step() {
  // Hooks can see the iteration they are about to run through the storage.
  storage_.set_iter(iter_);
  for (auto& hook : hooks_) hook->before_step();
}

void Trainer::after_backward() {
  for (auto& hook : hooks_) hook->after_backward();
}

void Trainer::after_step() {
  for (auto& hook : hooks_) hook->after_step();
}

void Trainer::reset_data_loader(const std::function<std::shared_ptr<DataLoader>()>& build) {
  data_loader_.reset();
  data_loader_ = build();
  LOCKSTEP_CHECK(data_loader_ != nullptr, "reset_data_loader: the builder returned no data loader");
}

State Trainer::state() const {
  State state;
  state.values["iteration"] = iter_;
  // Where a resumed run goes on: after the iteration in progress (a hook's
  // save), or at iter() itself between iterations (a save by the caller of
  // step(), or after the run). Checkpoints without it go on after "iteration".
  state.values["next_iteration"] = phase_ == Phase::kInStep ? iter_ + 1 : iter_;
  State hooks;
  for (const auto& hook : hooks_) {
    if (hook->stateful()) hooks.put(hook->name(), hook->state());
  }
  state.put("hooks", std::move(hooks));
  if (data_loader_) state.put("data_loader", data_loader_->state());
  state.put("rng", capture_rng_state());
  for (const auto& hook : hooks_) hook->before_save_checkpoint(state);
  return state;
}

void Trainer::load_state(const State& state) {
  LOCKSTEP_CHECK(state.values.contains("iteration"), "the trainer state in the checkpoint has no iteration");
  iter_ = state.values.at("iteration").get<int64_t>();
  resume_iteration_ = state.values.value("next_iteration", iter_ + 1);
  State hooks = state.get("hooks");
  std::set<std::string> claimed;
  for (auto& hook : hooks_) {
    if (!hook->stateful() || !hooks.contains(hook->name())) continue;
    hook->load_state(hooks.get(hook->name()));
    claimed.insert(hook->name());
  }
  if (hooks.values.is_object()) {
    for (const auto& entry : hooks.values.items()) {
      if (claimed.count(entry.key()) == 0) {
        logger().warn("Cannot find a hook named '{}' to load its state from the checkpoint", entry.key());
      }
    }
  }
  if (state.contains("data_loader") && data_loader_) data_loader_->load_state(state.get("data_loader"));
  if (state.contains("rng")) restore_rng_state(state.get("rng"));
  for (auto& hook : hooks_) hook->after_load_checkpoint(state);
}

}  // namespace lockstep
