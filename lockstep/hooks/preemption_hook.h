// PreemptionHook: stops a run that received a scheduler's stop signal, on
// every rank at the same iteration, so that it saves and exits to be started
// again (SLURM's preemption and time limit, Kubernetes' pod eviction, a
// SIGTERM to `lockstep run` or torchrun).
//
// The signal itself is caught by a StopSignals the Runner installs for the
// run (core/stop_signals.h, config key `preemption`); this hook reads it after
// every iteration and turns it into RunStop::request_preemption(): the
// ranks vote on it every check_interval iterations (a 4-byte all-reduce,
// which costs a 6 ms step 20% when done every iteration: bench/stop_vote.sh),
// agree on the iteration, PeriodicCheckpointer saves a checkpoint there
// (model_<iter>, found by resume), and `lockstep train` exits with
// kExitRequeue (75), after `scontrol requeue` when preemption.auto_requeue is
// on under SLURM.
//
//   trainer.register_hooks({std::make_shared<lockstep::PreemptionHook>()});  // with a StopSignals alive
#pragma once

#include "lockstep/engine/hook.h"

namespace lockstep {

class PreemptionHook : public Hook {
 public:
  // The ranks vote on the signal every `check_interval` iterations.
  explicit PreemptionHook(int64_t check_interval = 10);
  void before_train() override { check(); }
  void after_step() override { check(); }
  bool may_request_stop() const override { return true; }
  int64_t stop_vote_interval() const override { return check_interval_; }

 private:
  void check();
  int64_t check_interval_;
};

}  // namespace lockstep
