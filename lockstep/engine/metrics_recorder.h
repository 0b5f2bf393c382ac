// MetricsRecorder: how a trainer's step metrics reach its EventStorage.
//
// detectron2's SimpleTrainer._write_metrics: every gather_metric_period
// iterations the step's losses and metrics are gathered from every rank and
// averaged, data_time is the slowest rank's (what every rank waited for), and
// a loss that became infinite or NaN on any rank fails the run at that
// iteration on every rank. With `main_rank_values` every rank records rank
// 0's own values instead, as mmengine logs them (LogProcessor). With `async` the recording runs on one ordered background thread, off
// the step's path; flush() waits for it and rethrows its error.
//
//   lockstep::EventStorage storage;
//   lockstep::MetricsRecorder metrics(storage, gather, /*period=*/20, /*async=*/false);
//   if (metrics.records(iteration)) { /* read the step's values to the host */ }
//   metrics.write({{"loss", 0.25}}, /*data_time=*/0.01, iteration);
//   metrics.flush();
#pragma once

#include <cstdint>
#include <memory>

#include <c10/macros/Macros.h>

#include "lockstep/events/event_storage.h"
#include "lockstep/core/step_metrics.h"

namespace lockstep {

class OrderedWorker;

class MetricsRecorder {
 public:
  // `gather` null: this process's metrics only.
  MetricsRecorder(EventStorage& storage, MetricsGatherer gather, int64_t period, bool async,
                  bool main_rank_values = false);
  ~MetricsRecorder();
  C10_DISABLE_COPY_AND_ASSIGN(MetricsRecorder);

  // Whether `iteration`'s metrics are gathered and written.
  bool records(int64_t iteration) const { return (iteration + 1) % period_ == 0; }
  // Records one step's values (when records(iteration)); with `async`, queued.
  // `nonfinite_loss_iteration`: the first iteration this rank's loss was not
  // finite at (OptimWrapper::nonfinite_loss_iteration), or -1; any rank's
  // fails the run on every rank, naming the earliest.
  void write(const LogVars& log_vars, double data_time, int64_t iteration, int64_t nonfinite_loss_iteration = -1);
  // Waits for queued metrics and rethrows their error, if any.
  void flush();

 private:
  void record(const LogVars& log_vars, double data_time, int64_t iteration, int64_t nonfinite_loss_iteration);

  EventStorage& storage_;
  MetricsGatherer gather_;
  int64_t period_;
  bool main_rank_values_;
  std::unique_ptr<OrderedWorker> worker_;  // with async (lockstep/core/ordered_worker.h)
};

}  // namespace lockstep
