// PeriodicCheckpointer: saves "model_{iter:07d}" every `period` iterations and
// "model_final" at the end, keeping only the newest `max_to_keep` periodic
// files. The list of kept files is hook state, so the limit holds across a
// resume (mmengine's max_keep_ckpts). A preempted run (RunStop::preempted())
// saves one more periodic checkpoint at the iteration it stopped after.
//
//   auto hook = std::make_shared<lockstep::PeriodicCheckpointer>(checkpointer, /*period=*/1000,
//                                                                /*max_to_keep=*/3);
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "lockstep/engine/checkpointer.h"
#include "lockstep/engine/hook.h"

namespace lockstep {

class PeriodicCheckpointer : public Hook {
 public:
  PeriodicCheckpointer(std::shared_ptr<Checkpointer> checkpointer, int64_t period, int64_t max_to_keep = -1,
                       std::string file_prefix = "model", bool save_final = true);
  void after_step() override;
  // Writes the final checkpoint of a run another hook stopped early, or,
  // when the run was preempted, a periodic one to resume from.
  void after_train() override;

  bool stateful() const override { return true; }
  State state() const override;
  void load_state(const State& state) override;

 private:
  std::shared_ptr<Checkpointer> checkpointer_;
  int64_t period_;
  int64_t max_to_keep_;
  std::string file_prefix_;
  bool save_final_;
  std::deque<std::string> kept_;
  bool final_saved_ = false;
  int64_t last_saved_iteration_ = -1;
  void save_periodic(int64_t iteration);
};

}  // namespace lockstep
