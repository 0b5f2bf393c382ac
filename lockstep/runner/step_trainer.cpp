#include "lockstep/runner/step_trainer.h"

#include <torch/torch.h>

#include <exception>
#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"
#include "lockstep/comm/init.h"
#include "lockstep/engine/checkpointer.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/model/model.h"
#include "lockstep/runner/runner.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep {

StepTrainer::StepTrainer(Config config, StepTrainerOptions options)
    : StepTrainer(nullptr, std::move(config), std::move(options)) {}

StepTrainer::StepTrainer(std::shared_ptr<Model> model, Config config, StepTrainerOptions options) {
  // Before the strategy makes its groups; strategy.timeout_s and
  // LOCKSTEP_TIMEOUT_S still win.
  set_default_timeout(std::chrono::milliseconds(static_cast<int64_t>(kDefaultTimeoutS * 1000)));
  if (model) options.model(std::move(model));
  runner_ = std::make_unique<Runner>(std::move(config), std::move(options));
  try {
    trainer_ = &runner_->begin_steps();
  } catch (...) {
    runner_->discard_new_work_dir();  // a failed start leaves nothing behind
    throw;
  }
}

StepTrainer::~StepTrainer() {
  if (finished_ || trainer_ == nullptr || !trainer_->running() || std::uncaught_exceptions() > 0) return;
  try {
    finish();
  } catch (const std::exception& error) {
    logger().error("StepTrainer: ending the run failed: {}", short_torch_message(error));
  }
}

// Note [Every rank makes the same call]
// The collective calls must come in the same order on every rank. A rank in
// train_step while another is in predict would pair unrelated collectives
// (or none, under DDP, whose predict is local) and wait until the timeout.
// So each collective call first checks, in one tiny all-reduce, that every
// rank makes the same call with the same count; a mismatch fails every rank
// at once, naming what each rank called.
void StepTrainer::agree_on_call(Call call) {
  static const char* const kNames[] = {"train_step", "predict", "save_checkpoint", "load_checkpoint", "finish"};
  Collectives& ranks = *strategy().collectives();
  const int64_t code = static_cast<int64_t>(call) + 8 * calls_;
  if (ranks.world_size() == 1 || ranks.same_on_every_rank(code)) {
    ++calls_;
    return;
  }
  std::string text;
  const auto all = ranks.all_gather_json({{"call", kNames[static_cast<int>(call)]}, {"count", calls_}});
  for (size_t r = 0; r < all.size(); ++r) {
    text += str_cat(r ? ", " : "", "rank ", r, " called ", all[r].value("call", std::string("?")), " (its call ",
                    all[r].value("count", int64_t{-1}) + 1, ")");
  }
  throw DistributedError(str_cat("StepTrainer: the ranks made different calls (", text, "); every rank must call "
                                 "train_step, predict, save_checkpoint, load_checkpoint and finish in the same order"));
}

LogVars StepTrainer::train_step(const Batch& batch) {
  LOCKSTEP_CHECK(!finished_, "StepTrainer::train_step after finish(): the run is over");
  agree_on_call(Call::kTrainStep);
  return trainer_->step(batch);
}

Batch StepTrainer::predict(const Batch& batch) {
  LOCKSTEP_CHECK(!finished_, "StepTrainer::predict after finish(): the run is over");
  agree_on_call(Call::kPredict);
  Model& model = this->model();
  const bool was_training = model.is_training();
  model.eval();
  Batch outputs;
  try {
    outputs = model.val_step(batch);
  } catch (...) {
    if (was_training) model.train();
    throw;
  }
  if (was_training) model.train();
  return outputs;
}

std::string StepTrainer::save_checkpoint(const std::string& name) {
  LOCKSTEP_CHECK(!name.empty(), "StepTrainer::save_checkpoint: give a checkpoint name or a path ending in .ckpt");
  agree_on_call(Call::kSave);
  Checkpointer& checkpointer = runner_->checkpointer();
  const std::filesystem::path path(name);
  if (path.extension() == ".ckpt") {
    Checkpointer elsewhere(runner_->strategy_ptr(), path.parent_path().empty() ? "." : path.parent_path().string(),
                           checkpointer.run_info());
    return elsewhere.save(path.stem().string(), *trainer_);
  }
  return checkpointer.save(name, *trainer_);
}

int64_t StepTrainer::load_checkpoint(const std::string& path) {
  LOCKSTEP_CHECK(!finished_, "StepTrainer::load_checkpoint after finish(): the run is over");
  agree_on_call(Call::kLoad);
  CheckpointContents contents = runner_->checkpointer().load(ResumeChoice{path, std::nullopt});
  LOCKSTEP_CHECK(contents.trainer.has_value(), path, ": holds no trainer state (not a training checkpoint?)");
  trainer_->load_state(*contents.trainer);
  trainer_->continue_at(trainer_->resume_iteration());
  return trainer_->iter() - 1;  // the last iteration the checkpoint holds
}

void StepTrainer::log_scalar(const std::string& name, double value) {
  LOCKSTEP_CHECK(!name.empty(), "StepTrainer::log_scalar: the name is empty");
  trainer_->storage().put_scalar(name, value, /*smoothing_hint=*/false, trainer_->iter());
}

void StepTrainer::finish() {
  LOCKSTEP_CHECK(!finished_, "StepTrainer::finish: the run is already finished");
  finished_ = true;
  agree_on_call(Call::kFinish);
  runner_->end_steps();
}

int64_t StepTrainer::iteration() const { return trainer_->iter(); }
Strategy& StepTrainer::strategy() const { return runner_->strategy(); }
Model& StepTrainer::model() const { return *runner_->strategy().model(); }

}  // namespace lockstep
