// Schedules that anneal towards a floor: CosineAnnealing, Poly, OneCycle and
// CosineRestart (mmengine's chainable forms).
//
//   // Cosine from the initial lr down to 1% of it over iterations [500, 10000):
//   lockstep::ParamScheduler cosine(
//       optimizer, lockstep::make_rule(lockstep::CosineAnnealingOptions().eta_min_ratio(0.01)),
//       lockstep::ScheduleSpan().begin(500).end(10000), context);
//
// With k = iteration - begin, N = end - begin - 1 and `base` the group's
// initial value, a scheduler alone gives
//   CosineAnnealing  eta_min + (base - eta_min) * (1 + cos(pi * k / T_max)) / 2
//                    (periodic past T_max; eta_min = base * eta_min_ratio if given)
//   Poly             eta_min + (base - eta_min) * (1 - k / N)^power
//   OneCycle         cos or linear ramps initial -> max -> min (initial = eta_max /
//                    div_factor, min = initial / final_div_factor); not chainable
//   CosineRestart    in period j (lengths `periods`), at step s of the period:
//                    eta_min + (base * restart_weights[j] - eta_min) * (1 + cos(pi * s / periods[j])) / 2;
//                    unchanged after the last period
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "lockstep/optim/param_scheduler.h"

namespace lockstep {

struct CosineAnnealingOptions {
  TORCH_ARG(std::optional<int64_t>, T_max);          // > 0; default end - begin
  TORCH_ARG(std::optional<double>, eta_min);         // >= 0; default 0
  TORCH_ARG(std::optional<double>, eta_min_ratio);   // >= 0; exclusive with eta_min
};

struct PolyOptions {
  TORCH_ARG(double, eta_min) = 0.0;  // >= 0
  TORCH_ARG(double, power) = 1.0;    // > 0
};

struct OneCycleOptions {
  // One peak for every group, or one per group.
  explicit OneCycleOptions(std::vector<double> eta_max) : eta_max_(std::move(eta_max)) {}
  TORCH_ARG(std::vector<double>, eta_max);            // each > 0
  TORCH_ARG(std::optional<int64_t>, total_steps);     // > 0; default end - begin
  TORCH_ARG(double, pct_start) = 0.3;                 // in [0, 1]
  TORCH_ARG(std::string, anneal_strategy) = "cos";    // "cos" or "linear"
  TORCH_ARG(double, div_factor) = 25.0;               // > 0
  TORCH_ARG(double, final_div_factor) = 1e4;          // > 0
  TORCH_ARG(bool, three_phase) = false;
};

struct CosineRestartOptions {
  explicit CosineRestartOptions(std::vector<int64_t> periods) : periods_(std::move(periods)) {}
  TORCH_ARG(std::vector<int64_t>, periods);                 // non-empty, each > 0
  TORCH_ARG(std::vector<double>, restart_weights) = {1.0};  // one per period, each >= 0
  TORCH_ARG(std::optional<double>, eta_min);                // exactly one of eta_min
  TORCH_ARG(std::optional<double>, eta_min_ratio);          // and eta_min_ratio
};

std::unique_ptr<ScheduleRule> make_rule(const CosineAnnealingOptions& options);
std::unique_ptr<ScheduleRule> make_rule(const PolyOptions& options);
std::unique_ptr<ScheduleRule> make_rule(const OneCycleOptions& options);
std::unique_ptr<ScheduleRule> make_rule(const CosineRestartOptions& options);

}  // namespace lockstep
