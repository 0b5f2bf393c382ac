// Hook: code that runs at fixed points of the training loop.
//
// detectron2's HookBase points (before_train, after_train, before_step,
// after_backward, after_step) and mmengine's: before/after_train_epoch,
// before/after_val_epoch and _iter, before/after_test_epoch and _iter,
// before_save_checkpoint and after_load_checkpoint. Hooks run by priority
// (mmengine's: HIGHEST 0 ... NORMAL 50 ... LOWEST 100; lower runs first),
// in registration order among equals, and hold a non-owning reference to
// their trainer. before_step should be cheap; put heavy work in after_step.
// A hook with state (a best metric, a list of kept checkpoints) saves it with
// the trainer, matched by name on load.
//
//   class PrintEvery100 : public lockstep::Hook {
//    public:
//     PrintEvery100() : Hook("PrintEvery100") {}
//     void after_step() override {
//       if ((trainer().iter() + 1) % 100 == 0) std::cout << trainer().iter() << "\n";
//     }
//   };
//   trainer.register_hooks({std::make_shared<PrintEvery100>()});
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <c10/macros/Macros.h>

#include "lockstep/core/state.h"
#include "lockstep/model/batch.h"

namespace lockstep {

class Trainer;

// mmengine's hook priorities; any integer in between works too.
enum HookPriority : int {
  kHighest = 0,
  kVeryHigh = 10,
  kHigh = 30,
  kAboveNormal = 40,
  kNormal = 50,
  kBelowNormal = 60,
  kLow = 70,
  kVeryLow = 90,
  kLowest = 100,
};
// "VERY_HIGH", ... or the number as text; throws naming the accepted names.
int parse_hook_priority(const std::string& text);
// "VERY_HIGH" for 10; other values as their number.
std::string hook_priority_name(int priority);

class Hook {
 public:
  explicit Hook(std::string name, int priority = kNormal) : name_(std::move(name)), priority_(priority) {}
  virtual ~Hook() = default;
  C10_DISABLE_COPY_AND_ASSIGN(Hook);

  virtual void before_train() {}
  // Runs even when training failed; trainer().iter() == max_iter tells success.
  virtual void after_train() {}
  virtual void before_step() {}
  // After the backward pass, before the optimizer step. Under cuda_graph it
  // runs inside the captured step, once per kind of step: what it queues on
  // the GPU is replayed with the step, what it does on the host is not.
  virtual void after_backward() {}
  virtual void after_step() {}

  // Around each epoch of training: before its first iteration and after its
  // last (a run resumed mid-epoch starts without before_train_epoch).
  virtual void before_train_epoch() {}
  virtual void after_train_epoch() {}
  // Around a validation or test pass, and each of its batches. `metrics` are
  // the pass's results; `outputs` what the model's val_step returned.
  virtual void before_val_epoch() {}
  virtual void after_val_epoch(const std::map<std::string, double>& /*metrics*/) {}
  virtual void before_val_iter(int64_t /*batch_index*/, const Batch& /*batch*/) {}
  virtual void after_val_iter(int64_t /*batch_index*/, const Batch& /*batch*/, const Batch& /*outputs*/) {}
  virtual void before_test_epoch() {}
  virtual void after_test_epoch(const std::map<std::string, double>& /*metrics*/) {}
  virtual void before_test_iter(int64_t /*batch_index*/, const Batch& /*batch*/) {}
  virtual void after_test_iter(int64_t /*batch_index*/, const Batch& /*batch*/, const Batch& /*outputs*/) {}
  // `checkpoint` is the trainer state about to be saved: a hook may add
  // entries of its own. after_load_checkpoint sees the state just loaded.
  virtual void before_save_checkpoint(State& /*checkpoint*/) {}
  virtual void after_load_checkpoint(const State& /*checkpoint*/) {}

  // A hook that may call trainer().stop().request() returns true. In a
  // distributed run the trainer then agrees on stops after every iteration
  // (one tiny all-reduce), so that every rank stops at the same one; a stop
  // requested where no registered hook declares this is an error there.
  virtual bool may_request_stop() const { return false; }
  // How often, in iterations, such a hook needs the ranks to vote: the
  // trainer votes after iteration i when i + 1 is a multiple of the interval
  // of any hook that may request a stop (and after before_train). A request
  // waits for the next vote. PreemptionHook votes every 10 iterations: a
  // signal can wait that long, the step should not pay a collective each time.
  virtual int64_t stop_vote_interval() const { return 1; }

  // Whether this hook does anything in this process. One that does not (the
  // progress bar where stderr is no terminal, or on a rank other than 0) is
  // left out when registered, so that the hook list and every output read as
  // they would without it.
  virtual bool active() const { return true; }

  // Stateful hooks return true and implement state()/load_state().
  virtual bool stateful() const { return false; }
  virtual State state() const { return {}; }
  virtual void load_state(const State& /*state*/) {}

  const std::string& name() const { return name_; }
  int priority() const { return priority_; }
  // Before registration only (the trainer orders hooks as they register).
  void set_priority(int priority);
  // The trainer this hook is registered with; an error before registration.
  Trainer& trainer() const;

 private:
  friend class HookList;  // attaches the hook to its trainer
  std::string name_;
  int priority_;
  Trainer* trainer_ = nullptr;
};

}  // namespace lockstep
