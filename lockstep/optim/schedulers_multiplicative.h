// Schedules that multiply the current value by a factor: Constant, Linear,
// Step, MultiStep, Exponential (mmengine's chainable forms).
//
//   // Linear warm-up of lr over the first 500 iterations:
//   lockstep::ParamScheduler warmup(
//       optimizer, lockstep::make_rule(lockstep::LinearOptions().start_factor(0.001)),
//       lockstep::ScheduleSpan().end(500));
//
// With k = iteration - begin and N = end - begin - 1, a scheduler alone gives
//   Constant     base * factor for k < N, base at k = N (the factor is undone
//                on the last step of the range)
//   Linear       base * (start + (end_factor - start) * k / N)
//   Step         base * gamma^floor(k / step_size)
//   MultiStep    base * gamma^(number of milestones <= k)  (repeats count twice)
//   Exponential  base * gamma^k
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/arg.h>

#include "lockstep/optim/param_scheduler.h"

namespace lockstep {

struct ConstantOptions {
  TORCH_ARG(double, factor) = 1.0 / 3;  // in (0, 1]
};

struct LinearOptions {
  TORCH_ARG(double, start_factor) = 1.0 / 3;  // in (0, 1]
  TORCH_ARG(double, end_factor) = 1.0;        // in [0, 1]
};

struct StepOptions {
  explicit StepOptions(int64_t step_size) : step_size_(step_size) {}
  TORCH_ARG(int64_t, step_size);  // > 0, in iterations
  TORCH_ARG(double, gamma) = 0.1;   // > 0
};

struct MultiStepOptions {
  explicit MultiStepOptions(std::vector<int64_t> milestones) : milestones_(std::move(milestones)) {}
  TORCH_ARG(std::vector<int64_t>, milestones);  // non-empty, >= 0, non-decreasing, relative to begin
  TORCH_ARG(double, gamma) = 0.1;                 // > 0
};

struct ExponentialOptions {
  explicit ExponentialOptions(double gamma) : gamma_(gamma) {}
  TORCH_ARG(double, gamma);  // > 0
};

// Each validates its options and throws OptionError naming the bad key.
std::unique_ptr<ScheduleRule> make_rule(const ConstantOptions& options);
std::unique_ptr<ScheduleRule> make_rule(const LinearOptions& options);
std::unique_ptr<ScheduleRule> make_rule(const StepOptions& options);
std::unique_ptr<ScheduleRule> make_rule(const MultiStepOptions& options);
std::unique_ptr<ScheduleRule> make_rule(const ExponentialOptions& options);

}  // namespace lockstep
