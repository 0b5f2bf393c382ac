// HookList: a trainer's hooks, in the order every hook point runs them, and
// the hook points themselves.
//
// Hooks run by priority (lower first), in registration order among equals
// (hook.h). Each hook point calls every hook; after_train calls every hook
// even when some throw, and rethrows the first error once all have run
// (detectron2 runs after_train in a `finally`). The list also saves and
// restores the hooks' states with the trainer's, matched by name.
//
//   lockstep::HookList& hooks = trainer.hooks();
//   hooks.before_eval_epoch(/*test=*/false);          // an evaluation pass
//   for (int64_t i = 0; i < batches; ++i) {
//     hooks.before_eval_iter(false, i, batch);
//     hooks.after_eval_iter(false, i, batch, outputs);
//   }
//   hooks.after_eval_epoch(false, metrics);
//   for (const auto& hook : hooks) std::cout << hook->name() << "\n";
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/state.h"
#include "lockstep/engine/hook.h"

namespace lockstep {

class HookList {
 public:
  using const_iterator = std::vector<std::shared_ptr<Hook>>::const_iterator;

  // Adds `hooks` (null and inactive ones are skipped: Hook::active) by
  // priority, after those of equal priority already added, and attaches them
  // to `trainer`. A hook attached to another trainer is an error.
  void add(const std::vector<std::shared_ptr<Hook>>& hooks, Trainer& trainer);
  size_t size() const { return hooks_.size(); }
  const_iterator begin() const { return hooks_.begin(); }
  const_iterator end() const { return hooks_.end(); }
  // Logs the hooks in the order every hook point runs them.
  void log_order() const;

  // The training loop's points.
  void before_train();
  // Every hook's after_train, whatever an earlier one did; then rethrows
  // `first_error` (an error of the caller's before the hooks ran), or else
  // the first hook's error.
  void after_train(std::exception_ptr first_error);
  void before_train_epoch();
  void after_train_epoch();
  void before_step();
  void after_backward();
  void after_step();

  // An evaluation pass's points (mmengine's val/test loop); `test` selects
  // the test_* points.
  void before_eval_epoch(bool test);
  void after_eval_epoch(bool test, const std::map<std::string, double>& metrics);
  void before_eval_iter(bool test, int64_t batch_index, const Batch& batch);
  void after_eval_iter(bool test, int64_t batch_index, const Batch& batch, const Batch& outputs);

  // How often the ranks vote on stops: the stop_vote_interval of each hook
  // that may request a stop (empty: none may, so no vote is needed).
  std::vector<int64_t> stop_vote_intervals() const;

  // The checkpoint's part: {name: state} of the stateful hooks.
  State state() const;
  // Gives each stateful hook its state from what state() saved; warns about
  // states no hook claims.
  void load_state(const State& states);
  // Around the whole trainer state: every hook may add to the state about to
  // be saved, and sees the state just loaded.
  void before_save_checkpoint(State& checkpoint) const;
  void after_load_checkpoint(const State& checkpoint) const;

 private:
  std::vector<std::shared_ptr<Hook>> hooks_;
};

}  // namespace lockstep
