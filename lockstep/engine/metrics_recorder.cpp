#include "lockstep/engine/metrics_recorder.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/core/ordered_worker.h"

namespace lockstep {

// The metrics writer's bounds: a queue of 16 gathers is far ahead of any
// writer, and a gather that has not returned within 30 minutes (the process
// groups' own default timeout) waits for a rank that will not come.
constexpr int kMetricsQueueCapacity = 16;
constexpr double kMetricsWaitLimitSeconds = 1800;

MetricsRecorder::MetricsRecorder(EventStorage& storage, MetricsGatherer gather, int64_t period, bool async)
    : storage_(storage), gather_(std::move(gather)), period_(period) {
  LOCKSTEP_CHECK(period_ >= 1, "gather_metric_period must be at least 1, got ", period_);
  if (!gather_) gather_ = [](const LogVars& local) { return std::vector<LogVars>{local}; };
  if (async) {
    worker_ = std::make_unique<OrderedWorker>("metrics writer", kMetricsQueueCapacity, kMetricsWaitLimitSeconds);
  }
}

MetricsRecorder::~MetricsRecorder() = default;

void MetricsRecorder::write(const LogVars& log_vars, double data_time, int64_t iteration) {
  if (!records(iteration)) return;
  if (worker_) {
    worker_->rethrow_error();
    worker_->submit([this, log_vars, data_time, iteration] { record(log_vars, data_time, iteration); });
  } else {
    record(log_vars, data_time, iteration);
  }
}

void MetricsRecorder::record(const LogVars& log_vars, double data_time, int64_t iteration) {
  LogVars local = log_vars;
  local["data_time"] = data_time;
  storage_.put_scalar("rank_data_time", data_time, true, iteration);
  std::vector<LogVars> all = gather_(local);
  // The slowest rank's data time is what every rank waits for; the rest are averaged.
  double max_data_time = 0;
  LogVars mean;
  for (const auto& rank_metrics : all) {
    for (const auto& metric : rank_metrics) {
      if (metric.first == "data_time") {
        max_data_time = std::max(max_data_time, metric.second);
      } else {
        mean[metric.first] += metric.second / static_cast<double>(all.size());
      }
    }
  }
  auto total = mean.find("loss");
  if (total != mean.end() && !std::isfinite(total->second)) {
    std::ostringstream losses;
    for (const auto& metric : mean) losses << (losses.tellp() > 0 ? ", " : "") << metric.first << ": " << metric.second;
    LOCKSTEP_FAIL("Loss became infinite or NaN at iteration=", iteration, "!\nloss_dict = {", losses.str(), "}");
  }
  storage_.put_scalar("data_time", max_data_time, true, iteration);
  storage_.put_scalars(mean, true, iteration);
}

void MetricsRecorder::flush() {
  if (!worker_) return;
  worker_->drain();
  worker_->rethrow_error();
}

}  // namespace lockstep
