// EvalHook: runs evaluation every `period` iterations and once more after a
// run that completed (not after one that failed), writing the metrics into
// the storage. detectron2's EvalHook semantics, including a barrier after each
// evaluation so ranks leave it together.
//
//   auto eval = std::make_shared<lockstep::EvalHook>(/*period=*/938, [&] { return runner.validate(); });
#pragma once

#include <functional>
#include <map>
#include <string>

#include "lockstep/engine/hook.h"

namespace lockstep {

class EvalHook : public Hook {
 public:
  using EvalFunction = std::function<std::map<std::string, double>()>;
  // `barrier` is called after each evaluation (no-op on one process).
  // `iters_per_epoch` > 0 (a run that counts epochs): each evaluation also
  // records "epoch", the epochs completed, so that metrics.jsonl's
  // epoch-wise lines say which epoch they close (`lockstep plot --x epoch`).
  EvalHook(int64_t period, EvalFunction evaluate, std::function<void()> barrier = nullptr,
           int64_t iters_per_epoch = 0);
  void after_step() override;
  void after_train() override;
  int64_t period() const { return period_; }

 private:
  // `completed`: the iterations run so far.
  void run_evaluation(int64_t completed);
  int64_t period_;
  EvalFunction evaluate_;
  std::function<void()> barrier_;
  int64_t iters_per_epoch_;
  int64_t last_evaluated_ = -1;  // iterations completed at the last evaluation
};

}  // namespace lockstep
