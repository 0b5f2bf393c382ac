// Hook: code that runs at fixed points of the training loop.
//
// detectron2's HookBase: before_train, after_train, before_step,
// after_backward, after_step. Hooks run in registration order and hold a
// non-owning reference to their trainer. before_step should be cheap; put
// heavy work in after_step. A hook with state (a best metric, a list of kept
// checkpoints) saves it with the trainer, matched by name on load.
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

#include <string>

#include "lockstep/core/state.h"

namespace lockstep {

class Trainer;

class Hook {
 public:
  explicit Hook(std::string name) : name_(std::move(name)) {}
  virtual ~Hook() = default;
  Hook(const Hook&) = delete;
  Hook& operator=(const Hook&) = delete;

  virtual void before_train() {}
  // Runs even when training failed; trainer().iter() == max_iter tells success.
  virtual void after_train() {}
  virtual void before_step() {}
  // After the backward pass, before the optimizer step.
  virtual void after_backward() {}
  virtual void after_step() {}

  // Stateful hooks return true and implement state()/load_state().
  virtual bool stateful() const { return false; }
  virtual State state() const { return {}; }
  virtual void load_state(const State& /*state*/) {}

  const std::string& name() const { return name_; }
  // The trainer this hook is registered with; an error before registration.
  Trainer& trainer() const;
  bool registered() const { return trainer_ != nullptr; }

 private:
  friend class Trainer;
  std::string name_;
  Trainer* trainer_ = nullptr;
};

}  // namespace lockstep
