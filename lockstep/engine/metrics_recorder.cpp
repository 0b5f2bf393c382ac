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

MetricsRecorder::MetricsRecorder(EventStorage& storage, MetricsGatherer gather, int64_t period, bool async,
                                 bool main_rank_values)
    : storage_(storage), gather_(std::move(gather)), period_(period), main_rank_values_(main_rank_values) {
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

namespace {
// "name: value, ..." of one set of metrics, for an error message.
std::string listed(const LogVars& metrics) {
  std::ostringstream text;
  for (const auto& metric : metrics) text << (text.tellp() > 0 ? ", " : "") << metric.first << ": " << metric.second;
  return text.str();
}

// detectron2's values: the slowest rank's data time is what every rank
// waits for; the rest are averaged over ranks.
LogVars mean_over_ranks(const std::vector<LogVars>& all) {
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
  mean["data_time"] = max_data_time;
  return mean;
}
}  // namespace

// Note [Whose values are logged]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// detectron2 gathers every rank's metrics and logs their mean; mmengine logs
// what rank 0 computed (its parse_losses reduces nothing across ranks, and
// only rank 0 writes). Both are deterministic, and under DDP the ranks'
// losses differ (each sees its own batch), so a run logged one way cannot be
// compared with a run logged the other. The gather happens either way: the
// stop on a non-finite loss must be every rank's, and every rank's storage
// must hold the same numbers, since hooks decide from them.
void MetricsRecorder::record(const LogVars& log_vars, double data_time, int64_t iteration) {
  LogVars local = log_vars;
  local["data_time"] = data_time;
  storage_.put_scalar("rank_data_time", data_time, true, iteration);
  const std::vector<LogVars> all = gather_(local);
  // Every rank's loss is looked at, whichever values are logged: a loss that
  // is not finite on one rank stops them all at the same iteration.
  for (size_t rank = 0; rank < all.size(); ++rank) {
    auto total = all[rank].find("loss");
    if (total == all[rank].end() || std::isfinite(total->second)) continue;
    LOCKSTEP_FAIL("Loss became infinite or NaN at iteration=", iteration, " on rank ", rank, "!\nloss_dict = {",
                  listed(all[rank]), "}");
  }
  // mmengine logs rank 0's own values (Note [Whose values are logged]).
  storage_.put_scalars(main_rank_values_ ? all.front() : mean_over_ranks(all), true, iteration);
}

void MetricsRecorder::flush() {
  if (!worker_) return;
  worker_->drain();
  worker_->rethrow_error();
}

}  // namespace lockstep
