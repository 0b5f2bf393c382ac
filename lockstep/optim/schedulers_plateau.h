// ReduceOnPlateauLR / ReduceOnPlateauMomentum: lower a value when a
// validation metric stops improving.
//
// PyTorch's ReduceLROnPlateau and mmengine's ReduceOnPlateauParamScheduler,
// term by term: after each validation pass (step_with_metrics), a metric
// better than the best by `threshold` (relative or absolute, by
// threshold_rule) becomes the best and clears the count of bad passes;
// otherwise the count grows. During `cooldown` passes after a reduction the
// count stays 0. When it exceeds `patience`, every group's value becomes
// max(value * factor, min_value), unless that changes it by eps or less.
// Reductions happen only while begin <= iteration < end. The state (best,
// counts) is saved and resumed with the other schedulers.
//
//   param_scheduler:
//     - {type: ReduceOnPlateauLR, monitor: loss, rule: less, factor: 0.5, patience: 2, min_value: 1e-5}
#pragma once

#include <map>
#include <string>
#include <vector>

#include "lockstep/optim/param_scheduler.h"

namespace lockstep {

struct PlateauOptions {
  TORCH_ARG(std::string, monitor) = "loss";
  TORCH_ARG(std::string, rule) = "less";  // "less" (PyTorch's mode min) or "greater"
  TORCH_ARG(double, factor) = 0.1;
  TORCH_ARG(int64_t, patience) = 10;
  TORCH_ARG(double, threshold) = 1e-4;
  TORCH_ARG(std::string, threshold_rule) = "rel";  // "rel" or "abs"
  TORCH_ARG(int64_t, cooldown) = 0;
  TORCH_ARG(std::vector<double>, min_value) = std::vector<double>{0.0};  // one, or one per group
  TORCH_ARG(double, eps) = 1e-8;
};

class ReduceOnPlateauScheduler : public ParamScheduler {
 public:
  // Throws OptionError (naming the key) on bad options.
  ReduceOnPlateauScheduler(torch::optim::Optimizer& optimizer, PlateauOptions options, const ScheduleSpan& span,
                           const SchedulerContext& context = SchedulerContext());

  void step_with_metrics(const std::map<std::string, double>& metrics) override;
  bool replayable() const override { return false; }
  State state() const override;
  void load_state(const State& state) override;

  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }

 private:
  bool is_better(double value) const;

  PlateauOptions options_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
};

}  // namespace lockstep
