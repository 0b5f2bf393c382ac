#include "lockstep/hooks/periodic_checkpointer.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "lockstep/core/error.h"
#include "lockstep/engine/trainer.h"
#include "lockstep/hooks/hook_registry.h"

namespace lockstep {

PeriodicCheckpointer::PeriodicCheckpointer(std::shared_ptr<Checkpointer> checkpointer, int64_t period,
                                           int64_t max_to_keep, std::string file_prefix, bool save_final)
    : Hook("PeriodicCheckpointer"),
      checkpointer_(std::move(checkpointer)),
      period_(period),
      max_to_keep_(max_to_keep),
      file_prefix_(std::move(file_prefix)),
      save_final_(save_final) {
  LOCKSTEP_CHECK(period_ >= 1, "checkpoint period must be at least 1, got ", period_);
  LOCKSTEP_CHECK(max_to_keep_ == -1 || max_to_keep_ >= 1, "max_to_keep must be -1 (keep all) or at least 1, got ",
                 max_to_keep_);
}

void PeriodicCheckpointer::after_step() {
  const int64_t iteration = trainer().iter();
  if ((iteration + 1) % period_ == 0) save_periodic(iteration);
  if (save_final_ && iteration >= trainer().max_iter() - 1 && !trainer().stop().preempted()) {
    checkpointer_->save(file_prefix_ + "_final", trainer());
    final_saved_ = true;
  }
}

void PeriodicCheckpointer::save_periodic(int64_t iteration) {
  // The kept list is part of the state being saved, so update it first; the
  // files it drops are deleted only once the new checkpoint is safely written.
  const std::string name = fmt::format("{}_{:07d}", file_prefix_, iteration);
  // A run resumed at another world size renumbers its iterations by epoch
  // and may save under a name it kept before: that file is the new one now.
  const std::string path = checkpointer_->path_of(name);
  kept_.erase(std::remove(kept_.begin(), kept_.end(), path), kept_.end());
  kept_.push_back(path);
  std::vector<std::string> dropped;
  while (max_to_keep_ > 0 && static_cast<int64_t>(kept_.size()) > max_to_keep_) {
    dropped.push_back(kept_.front());
    kept_.pop_front();
  }
  checkpointer_->save(name, trainer());
  last_saved_iteration_ = iteration;
  for (const auto& path : dropped) checkpointer_->remove(path);
}

void PeriodicCheckpointer::after_train() {
  const Trainer& run = trainer();
  // Hooks tell a run that ended (finished, or stopped by agreement) from one
  // that failed by iter() == max_iter().
  if (run.iter() < run.max_iter()) return;
  if (run.stop().preempted()) {
    // Note [Saving on preemption]: the job is being stopped to run again later,
    // so the checkpoint is an ordinary periodic one (resume finds it through
    // last_checkpoint), not the final one, and only if this run trained at all.
    const int64_t last = run.iter() - 1;
    if (last >= run.start_iter() && last != last_saved_iteration_) save_periodic(last);
    return;
  }
  // A stop agreed after this hook's after_step (early stopping on another
  // rank): the final checkpoint is written here instead.
  if (save_final_ && !final_saved_ && run.stop().stopped_early()) {
    checkpointer_->save(file_prefix_ + "_final", run);
    final_saved_ = true;
  }
}

State PeriodicCheckpointer::state() const {
  State state;
  state.values["kept"] = std::vector<std::string>(kept_.begin(), kept_.end());
  return state;
}

void PeriodicCheckpointer::load_state(const State& state) {
  kept_.clear();
  if (state.values.contains("kept")) {
    for (const auto& path : state.values.at("kept")) kept_.push_back(path.get<std::string>());
  }
}

namespace {
// interval (in epochs with by_epoch, the default, else iterations; a run without
// epochs saves no periodic checkpoint unless it gives one), max_keep_ckpts (-1: all),
// file_prefix, save_last (also a "<prefix>_final" checkpoint at the end).
std::shared_ptr<Hook> build_periodic_checkpointer(const Config& config, const HookContext& context) {
  // A run without epochs (fed through the step API: iters_per_epoch 0) counts iterations by default.
  const bool by_epoch = config.get<bool>("by_epoch", context.iters_per_epoch > 0);
  LOCKSTEP_CHECK(!by_epoch || context.iters_per_epoch > 0, config.where("by_epoch"),
                 ": this run has no epochs (its batches come through the step API); count in iterations with "
                 "by_epoch: false");
  // Without epochs and without an interval (a simulation calling train_step
  // every time step), a checkpoint every iteration would fill its disk: such a
  // run saves only its final checkpoint and the ones it asks for.
  const bool step_run = context.iters_per_epoch == 0;
  int64_t interval = config.get<int64_t>("interval", step_run ? std::numeric_limits<int64_t>::max() : 1);
  LOCKSTEP_CHECK(interval >= 1, config.where("interval"), ": interval must be at least 1, got ", interval);
  if (by_epoch) interval *= context.iters_per_epoch;
  const int64_t max_keep = config.get<int64_t>("max_keep_ckpts", -1);
  LOCKSTEP_CHECK(max_keep == -1 || max_keep >= 1, config.where("max_keep_ckpts"),
                 ": max_keep_ckpts must be -1 (keep all) or at least 1, got ", max_keep);
  return std::make_shared<PeriodicCheckpointer>(context.checkpointer, interval, max_keep,
                                                config.get<std::string>("file_prefix", "model"),
                                                config.get<bool>("save_last", true));
}
}  // namespace

// mmengine calls it CheckpointHook (whose save_best is BestCheckpointer here).
LOCKSTEP_REGISTER(hook_registry(), "PeriodicCheckpointer", build_periodic_checkpointer);
LOCKSTEP_REGISTER(hook_registry(), "CheckpointHook", build_periodic_checkpointer);

}  // namespace lockstep
