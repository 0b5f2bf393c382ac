#include "lockstep/engine/metrics_recorder.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>
#include <utility>

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

void MetricsRecorder::write(const LogVars& log_vars, double data_time, int64_t iteration,
                            int64_t nonfinite_loss_iteration) {
  if (!records(iteration)) return;
  if (worker_) {
    worker_->rethrow_error();
    worker_->submit([this, log_vars, data_time, iteration, nonfinite_loss_iteration] {
      record(log_vars, data_time, iteration, nonfinite_loss_iteration);
    });
  } else {
    record(log_vars, data_time, iteration, nonfinite_loss_iteration);
  }
}

namespace {
// The gathered value that carries a rank's nonfinite_loss_iteration (taken
// out again before anything is recorded).
constexpr const char* kNonfiniteLossIteration = "lockstep.nonfinite_loss_iteration";

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
void MetricsRecorder::record(const LogVars& log_vars, double data_time, int64_t iteration,
                             int64_t nonfinite_loss_iteration) {
  LogVars local = log_vars;
  local["data_time"] = data_time;
  local[kNonfiniteLossIteration] = static_cast<double>(nonfinite_loss_iteration);
  storage_.put_scalar("rank_data_time", data_time, true, iteration);
  std::vector<LogVars> all = gather_(local);
  // A loss that was not finite since the last read: every optimizer step
  // from it on was skipped on every rank (Note [A non-finite loss stops
  // before the step]); the earliest rank's iteration is named.
  int64_t first_bad = -1;
  size_t first_bad_rank = 0;
  for (size_t rank = 0; rank < all.size(); ++rank) {
    auto mark = all[rank].find(kNonfiniteLossIteration);
    if (mark == all[rank].end()) continue;
    const auto at = static_cast<int64_t>(mark->second);
    all[rank].erase(mark);
    if (at >= 0 && (first_bad < 0 || at < first_bad)) std::tie(first_bad, first_bad_rank) = std::make_pair(at, rank);
  }
  if (first_bad >= 0) {
    LOCKSTEP_FAIL("Loss became infinite or NaN at iteration=", first_bad, " on rank ", first_bad_rank,
                  "! No rank stepped its optimizer from that iteration on: the weights are those after iteration ",
                  first_bad - 1, ".\nloss_dict = {", listed(all[first_bad_rank]), "} (rank ", first_bad_rank, ", iteration ",
                  iteration, ")");
  }
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
