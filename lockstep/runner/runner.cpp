#include "lockstep/runner/runner.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/checkpoint/dcp_checkpoint.h"
#include "lockstep/checkpoint/pretrained.h"
#include "lockstep/config/key_usage.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"
#include "lockstep/core/host_memory_policy.h"
#include "lockstep/core/logging.h"
#include "lockstep/core/rng.h"
#include "lockstep/data/data_loader.h"
#include "lockstep/comm/env.h"
#include "lockstep/engine/checkpointer.h"
#include "lockstep/evaluation/metric.h"
#include "lockstep/model/activation_checkpoint.h"
#include "lockstep/model/model.h"
#include "lockstep/hooks/preemption_hook.h"
#include "lockstep/runner/default_hooks.h"
#include "lockstep/runner/log_processor_config.h"
#include "lockstep/runner/preemption.h"
#include "lockstep/strategy/load_pretrained.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {
namespace fs = std::filesystem;

namespace {

TrainerOptions parse_trainer_options(const Config& config) {
  TrainerOptions options;
  if (config.is_null()) return options;
  options.zero_grad_before_forward(config.get<bool>("zero_grad_before_forward", false))
      .gather_metric_period(config.get<int64_t>("gather_metric_period", 1))
      .async_write_metrics(config.get<bool>("async_write_metrics", false));
  LOCKSTEP_CHECK(options.gather_metric_period() >= 1, config.where("gather_metric_period"),
                 ": gather_metric_period must be at least 1, got ", options.gather_metric_period());
  check_all_used(config, "trainer");
  return options;
}

// A job the launcher restarted after a failure (--max-restarts), or an
// elastic job's later round, continues from its last good checkpoint by
// itself: retraining from scratch would throw away the earlier attempts' work.
bool should_resume(const RunnerOptions& options, const Config& config) {
  return options.resume() || config.get<bool>("resume", false) || job_attempt() > 0;
}

std::string default_work_dir(const Config& config) {
  std::string file = config.source().file;
  std::string stem = file.empty() || file[0] == '<' ? "run" : fs::path(file).stem().string();
  return "work_dirs/" + stem;
}

// How long a run trains, from train_cfg: max_iters, or max_epochs of
// `iters_per_epoch`; whether it counts epochs; how often it evaluates, in
// iterations.
struct TrainLength {
  int64_t max_iters = 0;
  bool by_epoch = false;
  int64_t val_interval = 1;
};

TrainLength train_length(const Config& config, bool with_train_data, int64_t iters_per_epoch) {
  Config train_cfg = with_train_data ? config.at("train_cfg") : config.child("train_cfg");
  TrainLength length;
  if (!with_train_data) {
    LOCKSTEP_CHECK(!train_cfg.has("max_epochs"), train_cfg.where("max_epochs"),
                   ": a run fed through the step API has no epochs; give max_iters (or nothing: no end)");
    length.max_iters = train_cfg.is_null() ? Runner::kNoEnd : train_cfg.get<int64_t>("max_iters", Runner::kNoEnd);
  } else if (train_cfg.has("max_iters")) {
    LOCKSTEP_CHECK(!train_cfg.has("max_epochs"), train_cfg.where(), ": give max_iters or max_epochs, not both");
    length.max_iters = train_cfg.get<int64_t>("max_iters");
  } else {
    const int64_t epochs = train_cfg.get<int64_t>("max_epochs");
    LOCKSTEP_CHECK(epochs > 0, train_cfg.where("max_epochs"), ": max_epochs must be positive, got ", epochs);
    length.max_iters = epochs * iters_per_epoch;
  }
  LOCKSTEP_CHECK(length.max_iters > 0, train_cfg.where(), ": the run must have at least one iteration");
  length.by_epoch = with_train_data && train_cfg.get<bool>("by_epoch", train_cfg.has("max_epochs"));
  length.val_interval = train_cfg.is_null() ? 1 : train_cfg.get<int64_t>("val_interval", 1);
  LOCKSTEP_CHECK(length.val_interval >= 1, train_cfg.where("val_interval"), ": val_interval must be at least 1");
  if (length.by_epoch) length.val_interval *= iters_per_epoch;
  if (!train_cfg.is_null()) check_all_used(train_cfg, "train_cfg");
  return length;
}

}  // namespace

namespace {
// After the first iteration: every module that activation checkpointing
// turned on must have asked for it, else its forward cannot checkpoint.
class CheckpointingConsulted : public Hook {
 public:
  CheckpointingConsulted(std::shared_ptr<Model> model, std::string where)
      : Hook("ActivationCheckpointingCheck", kLowest), model_(std::move(model)), where_(std::move(where)) {}
  void after_step() override {
    if (checked_) return;
    checked_ = true;
    const std::vector<std::string> silent = unconsulted_checkpoint_modules(*model_);
    if (silent.empty()) return;
    std::string names;
    for (const auto& path : silent) names += (names.empty() ? "" : ", ") + path;
    LOCKSTEP_FAIL(where_, ": activation checkpointing was turned on for ", names,
                  " but their forward never asked for it: a module supports it by running its body through "
                  "lockstep::checkpointed(*this, fn, x) (model/activation_checkpoint.h)");
  }

 private:
  std::shared_ptr<Model> model_;
  std::string where_;
  bool checked_ = false;
};
}  // namespace

namespace {
// Every top-level key a run reads (the header lists what each holds).
const std::vector<std::string>& runner_config_keys() {
  static const std::vector<std::string> keys{
      "work_dir",        "randomness",      "env",           "strategy",        "model",
      "train_dataloader", "val_dataloader", "test_dataloader", "val_evaluator", "test_evaluator",
      "train_cfg",       "optim_wrapper",   "param_scheduler", "trainer",       "default_hooks",
      "custom_hooks",    "load_from",       "resume",        "activation_checkpointing", "preemption",
      "cuda_graph",      "log_processor"};
  return keys;
}
}  // namespace

Runner::Runner(Config config, RunnerOptions options) : config_(std::move(config)), options_(std::move(options)) {
  // Before anything else: a misspelt key (`--set train.max_iters=30` for
  // train_cfg.max_iters) must not silently train the default run.
  std::vector<std::string> known = runner_config_keys();
  known.insert(known.end(), options_.extra_config_keys().begin(), options_.extra_config_keys().end());
  check_known_keys(config_, known, "top-level key");
  try {
    setup_environment();
  } catch (...) {
    discard_new_work_dir();
    throw;
  }
}

void Runner::discard_new_work_dir() {
  if (!log_file_.empty()) remove_log_file(log_file_);
  log_file_.clear();
  if (created_work_dir_.empty()) return;
  std::error_code ignored;
  fs::remove_all(created_work_dir_, ignored);
  created_work_dir_.clear();
}

Runner::~Runner() = default;

Trainer& Runner::trainer() const {
  LOCKSTEP_CHECK(trainer_ != nullptr, "the runner has not built a trainer (call train() first)");
  return *trainer_;
}

Checkpointer& Runner::checkpointer() const {
  LOCKSTEP_CHECK(checkpointer_ != nullptr, "the runner has not built its checkpointer");
  return *checkpointer_;
}

// The checkpoint to resume, chosen once for every rank (Note [One resume
// decision]). A resumed run must replay the same data order: without a seed
// of its own it reuses that checkpoint's (which may be older than the newest,
// if that one is damaged).
void Runner::plan_resume() {
  resume_plan_.resume = should_resume(options_, config_);
  if (resume_plan_.resume) resume_plan_.checkpoint = checkpointer_->choose_resume();
  // Nothing of this run's own yet: resume from load_from when it is a
  // checkpoint (lockstep's, or a DCP directory PyTorch wrote), as mmengine's
  // resume=True with load_from does; pretrained weights stay load_from's. A
  // restarted run finds its own newer checkpoints first.
  const std::string resume_from = parse_load_from(config_.child("load_from"), options_.load_from()).path();
  if (resume_plan_.resume && !resume_plan_.checkpoint && !resume_from.empty() && fs::exists(resume_from) &&
      (is_dcp_checkpoint(resume_from) || is_lockstep_checkpoint_file(resume_from))) {
    resume_plan_.checkpoint = ResumeChoice{resume_from, std::nullopt};
  }
}

void Runner::setup_environment() {
  work_dir_ = !options_.work_dir().empty() ? options_.work_dir()
                                           : config_.get<std::string>("work_dir", default_work_dir(config_));
  Config env = config_.child("env");
  bool keep_freed_memory = true;
  if (!env.is_null()) {
    const int64_t threads = env.get<int64_t>("num_threads", 0);
    LOCKSTEP_CHECK(threads >= 0, env.where("num_threads"), ": num_threads must be >= 0 (0: libtorch's default)");
    if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
    keep_freed_memory = env.get<bool>("keep_freed_host_memory", true);
    check_all_used(env, "env");
  }
  if (keep_freed_memory) keep_freed_host_memory();  // Note [Freed activations stay in the process]
  strategy_ = build_strategy(config_.child("strategy"));
  const Environment environment = current_environment();
  const int launched = launched_world_size(environment);
  if (strategy_->collectives()->world_size() == 1 && launched > 1) {
    std::string rank = "?";
    for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
      if (environment.count(name)) {
        rank = environment.at(name);
        break;
      }
    }
    LOCKSTEP_FAIL(config_.where("strategy"), ": this process is rank ", rank, " of ", launched,
                  " started together by a launcher, but the strategy (", strategy_->name(),
                  ") trains in one process: ", launched, " copies would train ", launched,
                  " independent models into the same work dir. Set strategy: {type: DDPStrategy} (or FSDPStrategy) "
                  "to train them as one job, or start a single process.");
  }
  set_log_rank(strategy_->collectives()->rank(), strategy_->collectives()->world_size());
  if (strategy_->collectives()->is_main_process()) {
    // The outermost directory that does not exist yet: what discard_new_work_dir removes.
    fs::path outermost_new;
    for (fs::path dir = fs::absolute(work_dir_); !dir.empty() && !fs::exists(dir); dir = dir.parent_path()) {
      outermost_new = dir;
      if (dir == dir.parent_path()) break;
    }
    fs::create_directories(work_dir_);
    created_work_dir_ = outermost_new.string();
  }
  strategy_->collectives()->barrier();
  log_file_ = work_dir_ + (strategy_->collectives()->is_main_process() ? "/log.txt"
                                                        : "/log_rank" + std::to_string(strategy_->collectives()->rank()) + ".txt");
  add_log_file(log_file_);

  Config randomness = config_.child("randomness");
  std::optional<uint64_t> seed;
  if (!randomness.is_null() && randomness.has("seed") && !randomness.at("seed").is_null()) {
    seed = static_cast<uint64_t>(randomness.get<int64_t>("seed"));
  }
  checkpointer_ = std::make_shared<Checkpointer>(strategy_, work_dir_);
  plan_resume();
  if (!seed) seed = resume_plan_.seed();
  if (!seed) {
    seed = strategy_->collectives()->broadcast_seed(
        std::random_device{}() ^ static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  }
  seed_ = *seed;
  checkpointer_->set_run_info(Checkpointer::RunInfo{seed_, config_.to_yaml()});
  const bool diff_rank_seed = randomness.is_null() ? false : randomness.get<bool>("diff_rank_seed", false);
  const bool deterministic = randomness.is_null() ? false : randomness.get<bool>("deterministic", false);
  if (!randomness.is_null()) check_all_used(randomness, "randomness");
  seed_everything(seed_ + (diff_rank_seed ? static_cast<uint64_t>(strategy_->collectives()->rank()) : 0));
  if (deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  logger().info("Work dir {}; seed {}; strategy {} ({} process{})", work_dir_, seed_, strategy_->name(),
                strategy_->collectives()->world_size(), strategy_->collectives()->world_size() > 1 ? "es" : "");
  if (strategy_->collectives()->is_main_process()) write_file_atomically(work_dir_ + "/config.yaml", config_.to_yaml());
}

void Runner::build_for_training(bool with_train_data) {
  std::shared_ptr<Model> model = build_model();
  const bool checkpointing = apply_activation_checkpointing_config(*model);
  const int64_t iters_per_epoch = build_train_loader(with_train_data);
  const TrainLength length = train_length(config_, with_train_data, iters_per_epoch);
  max_iters_ = length.max_iters;
  by_epoch_ = length.by_epoch;

  strategy_->prepare(model, config_.at("optim_wrapper"), config_.child("param_scheduler"),
                     SchedulerContext{iters_per_epoch, length.max_iters});
  if (config_.has("val_dataloader")) eval_loader("val");

  TrainerOptions trainer_options = parse_trainer_options(config_.child("trainer"));
  trainer_options.log_processor(parse_log_processor(config_.child("log_processor")));
  if (config_.has("cuda_graph")) trainer_options.cuda_graph(prepare_cuda_graph());
  trainer_ = std::make_unique<Trainer>(strategy_->model(), train_loader_, strategy_->optim_wrapper(), trainer_options,
                                       strategy_->collectives()->metrics_gatherer());
  if (strategy_->collectives()->world_size() > 1) {
    std::shared_ptr<Collectives> ranks = strategy_->collectives();
    trainer_->stop().set_agreement([ranks](bool local) { return ranks->any_rank(local); });
  }
  register_hooks(iters_per_epoch, length.val_interval, trainer_options.log_processor());
  if (checkpointing) trainer_->register_hooks({std::make_shared<CheckpointingConsulted>(model, config_.where("activation_checkpointing"))});
}

std::shared_ptr<Model> Runner::build_model() {
  std::shared_ptr<Model> model = options_.model();
  if (!model) return strategy_->build_model(config_.at("model"));
  LOCKSTEP_CHECK(!config_.has("model"), config_.where("model"), ": this run's model was built in code (RunnerOptions "
                 "/ StepTrainer's model); give it there or in the config, not both");
  return model;
}

int64_t Runner::build_train_loader(bool with_train_data) {
  // A run fed by its caller (begin_steps) has no epochs: 0 iterations per
  // epoch makes anything counted in epochs an error that says so.
  if (!with_train_data) {
    LOCKSTEP_CHECK(!config_.has("train_dataloader"), config_.where("train_dataloader"),
                   ": a program that trains through the step API feeds its own batches; this key has no use here");
    LOCKSTEP_CHECK(!config_.has("preemption"), config_.where("preemption"),
                   ": a program that trains through the step API owns its signals; it stops, saves "
                   "(save_checkpoint) and exits as it sees fit");
    return 0;
  }
  train_loader_ = build_data_loader(config_.at("train_dataloader"),
                                    SamplerContext{strategy_->collectives()->rank(), strategy_->collectives()->world_size(), seed_});
  const int64_t iters_per_epoch = train_loader_->batches_per_epoch();
  LOCKSTEP_CHECK(iters_per_epoch > 0, config_.where("train_dataloader"),
                 ": the training set gives this rank no batch per epoch (dataset smaller than batch_size with "
                 "drop_last?)");
  return iters_per_epoch;
}

void Runner::register_hooks(int64_t iters_per_epoch, int64_t val_interval, const LogProcessor& log_processor) {
  HookContext context;
  context.strategy = strategy_;
  context.collectives = strategy_->collectives();
  context.checkpointer = checkpointer_;
  context.work_dir = work_dir_;
  context.iters_per_epoch = iters_per_epoch;
  context.by_epoch = by_epoch_;
  context.max_iters = max_iters_;
  context.val_interval = val_interval;
  context.log_processor = log_processor;
  if (eval_loaders_.count("val")) context.evaluate = [this] { return evaluate("val"); };
  trainer_->register_hooks(build_default_hooks(config_.child("default_hooks"), config_.child("custom_hooks"), context));
}

DataLoader& Runner::eval_loader(const std::string& split) {
  auto found = eval_loaders_.find(split);
  if (found != eval_loaders_.end()) return *found->second;
  const std::string key = split + "_dataloader";
  LOCKSTEP_CHECK(config_.has(key), "no ", key, " in the config");
  std::shared_ptr<DataLoader> loader =
      build_data_loader(config_.at(key), SamplerContext{strategy_->collectives()->rank(), strategy_->collectives()->world_size(), seed_});
  evaluators_[split] = build_evaluator(config_.at(split + "_evaluator"));
  eval_loaders_[split] = loader;
  return *loader;
}

CudaGraphOptions Runner::prepare_cuda_graph() {
  const Config section = config_.at("cuda_graph");
  const CudaGraphOptions options = parse_cuda_graph_options(section);
  std::string obstacle = strategy_->cuda_graph_obstacle();
  if (obstacle.empty()) {
    const Config optimizer = config_.at("optim_wrapper").child("optimizer");
    const std::string type = optimizer.is_map() ? optimizer.get<std::string>("type", "") : "";
    obstacle = prepare_optimizer_for_cuda_graph(*strategy_->optim_wrapper(), type);
  }
  LOCKSTEP_CHECK(obstacle.empty(), section.where(), ": cuda_graph cannot capture this run's training step: ", obstacle);
  logger().info("cuda_graph: {} eager warm-up step(s), then each kind of step is captured once and replayed "
                "(the optimizer's step is capturable for the whole run)",
                options.warmup_iters());
  return options;
}

bool Runner::apply_activation_checkpointing_config(Model& model) {
  Config section = config_.child("activation_checkpointing");
  if (section.is_null()) return false;
  LOCKSTEP_CHECK(section.is_map(), section.where(), ": activation_checkpointing is a map: {module_types: [Block]}");
  const auto types = section.get<std::vector<std::string>>("module_types");
  check_all_used(section, "activation_checkpointing");
  std::vector<std::string> paths;
  try {
    paths = apply_activation_checkpointing(model, types);
  } catch (const Error& error) {
    LOCKSTEP_FAIL(section.where("module_types"), ": ", error.what());
  }
  logger().info("Activation checkpointing: {} module(s) keep only their inputs and recompute in backward (first: {})",
                paths.size(), paths.front());
  return true;
}

std::map<std::string, double> Runner::train() {
  build_for_training(/*with_train_data=*/true);
  const PreemptionSettings preemption = parse_preemption(config_.child("preemption"));
  if (!preemption.signals.empty()) {
    // Installed before the resume: a signal that comes while the checkpoint
    // loads stops the run after its first iteration, saved.
    stop_signals_ = std::make_unique<StopSignals>(preemption.signals, preemption.grace_s);
    trainer_->register_hooks({std::make_shared<PreemptionHook>(preemption.check_interval)});
  }
  const int64_t start_iter = restore(resume_plan_);
  trainer_->train(std::min(start_iter, max_iters_), max_iters_);
  strategy_->finish_checkpoint_saves();  // a save in the background is whole before the run ends
  if (trainer_->stop().preempted()) {
    logger().warn("Preempted after iteration {} of {}: the checkpoint to resume from is saved; exiting with status {} "
                  "to be started again (resume: true continues the run bitwise)",
                  trainer_->iter() - 1, max_iters_, kExitRequeue);
    if (preemption.auto_requeue && strategy_->collectives()->is_main_process()) logger().warn("{}", requeue_slurm_job());
    return last_val_metrics_;
  }
  return last_val_metrics_;
}

Trainer& Runner::begin_steps() {
  LOCKSTEP_CHECK(trainer_ == nullptr, "begin_steps(): this runner has already built its trainer");
  build_for_training(/*with_train_data=*/false);
  const int64_t start_iter = restore(resume_plan_);
  trainer_->begin(std::min(start_iter, max_iters_), max_iters_);
  return *trainer_;
}

void Runner::end_steps() {
  LOCKSTEP_CHECK(trainer_ != nullptr, "end_steps(): begin_steps() was not called");
  trainer_->end();
  strategy_->finish_checkpoint_saves();
}

int64_t Runner::restore(const ResumePlan& plan) {
  int64_t start_iter = 0;
  const bool resuming = plan.resume;
  const char* requeues = std::getenv("SLURM_RESTART_COUNT");
  if (resuming && requeues != nullptr && std::atoi(requeues) > 0) {
    logger().info("SLURM requeued this job ({} time(s)): resuming from the last good checkpoint in {}", requeues,
                  work_dir_);
  } else if (resuming && job_attempt() != restart_count()) {
    logger().info("Rendezvous round {} of this elastic job ({} restart(s) after failures): resuming from the last "
                  "good checkpoint in {}", job_attempt(), restart_count(), work_dir_);
  } else if (resuming && restart_count() > 0) {
    logger().info("Restart {} of this job: resuming from the last good checkpoint in {}", restart_count(), work_dir_);
  }
  const PretrainedOptions load_from = parse_load_from(config_.child("load_from"), options_.load_from());
  std::optional<CheckpointContents> resumed;
  if (resuming) {
    if (plan.checkpoint) {
      resumed = checkpointer_->load(*plan.checkpoint);
    } else {
      logger().warn("resume: no checkpoint in {}; starting from scratch", work_dir_);
    }
  }
  if (resumed) {
    // No meta: a checkpoint lockstep did not write (PyTorch's DCP), which holds no scheduler state.
    const int saved_world = resumed->meta ? resumed->meta->world_size : strategy_->collectives()->world_size();
    const bool replay_schedulers = !resumed->meta || saved_world != strategy_->collectives()->world_size();
    if (saved_world != strategy_->collectives()->world_size()) {
      logger().warn("The checkpoint was written by {} processes and this run has {}: the effective batch size "
                    "changes from here on, and the rest of the interrupted epoch is shared among {} processes",
                    saved_world, strategy_->collectives()->world_size(), strategy_->collectives()->world_size());
    }
    LOCKSTEP_CHECK(resumed->trainer.has_value(), work_dir_, ": the checkpoint resumed holds no trainer state");
    trainer_->load_state(*resumed->trainer);
    start_iter = trainer_->resume_iteration();
    // A run counted in epochs goes on from where its data is: at another world
    // size an epoch has another number of iterations.
    if (by_epoch_) {
      const DataLoader& loader = trainer_->data_loader();
      const int64_t position = loader.epoch() * loader.batches_per_epoch() + loader.batch_in_epoch();
      if (position != start_iter) {
        logger().info("Iteration {} of the checkpoint is iteration {} here (epoch {}, batch {} of {})", start_iter,
                      position, loader.epoch(), loader.batch_in_epoch(), loader.batches_per_epoch());
        start_iter = position;
      }
    }
    // Saved scheduler steps count iterations of the saved world size (Strategy::load_checkpoint skipped them).
    if (replay_schedulers) strategy_->replay_schedulers(start_iter);
  } else if (!load_from.path().empty()) {
    load_pretrained(*strategy_, load_from);
  }
  return start_iter;
}

std::map<std::string, double> Runner::evaluate(const std::string& split) {
  DataLoader& loader = eval_loader(split);
  if (!strategy_->model()) {
    strategy_->prepare(strategy_->build_model(config_.at("model")), Config(), Config(), SchedulerContext{});
  }
  Model& model = *strategy_->model();
  Evaluator& evaluator = *evaluators_.at(split);
  // The trainer's hooks see the pass (EMA weights swap in, early stopping reads the metrics).
  HookList* hooks = trainer_ ? &trainer_->hooks() : nullptr;
  const bool test = split == "test";
  const bool was_training = model.is_training();
  model.eval();
  if (hooks) hooks->before_eval_epoch(test);
  int64_t batch_index = 0;
  loader.for_each_batch(0, [&](const Batch& batch) {
    if (hooks) hooks->before_eval_iter(test, batch_index, batch);
    const Batch outputs = model.val_step(batch);
    evaluator.process(batch, outputs);
    if (hooks) hooks->after_eval_iter(test, batch_index, batch, outputs);
    ++batch_index;
  });
  if (was_training) model.train();
  auto metrics = evaluator.evaluate(loader.dataset().size(),
                                    [this](const std::vector<nlohmann::json>& local, int64_t size) {
                                      return strategy_->collectives()->collect_results(local, size);
                                    });
  if (hooks) hooks->after_eval_epoch(test, metrics);
  std::string text;
  for (const auto& [name, value] : metrics) text += fmt::format("  {}: {:.4f}", name, value);
  logger().info("Evaluation on {} ({} samples):{}", split, loader.dataset().size(), text);
  if (split == "val") last_val_metrics_ = metrics;
  return metrics;
}

std::map<std::string, double> Runner::val() { return evaluate("val"); }
std::map<std::string, double> Runner::test() { return evaluate("test"); }

}  // namespace lockstep
