// The words every layer uses for a training step's metrics, in one home
// below the optimizer, the model, the strategies and the trainer that all
// speak them:
//   LogVars          a step's scalars by name ("loss", "loss_cls", "grad_norm");
//   MetricsGatherer  gathers one rank's LogVars from every rank, in rank order,
//                    on every rank (so all ranks reach the same verdict on a
//                    non-finite loss): Collectives::metrics_gatherer();
//   kNoEnd           the max_iter of a run without an end (a program that
//                    trains as it goes): large, and far from overflowing when
//                    counted up to.
//
//   lockstep::LogVars metrics{{"loss", 0.25}};
//   std::vector<lockstep::LogVars> all = gather(metrics);  // all[r]: rank r's
//   if (max_iter >= lockstep::kNoEnd) { /* no ETA */ }
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace lockstep {

using LogVars = std::map<std::string, double>;

using MetricsGatherer = std::function<std::vector<LogVars>(const LogVars& local)>;

inline constexpr int64_t kNoEnd = std::numeric_limits<int64_t>::max() / 4;

}  // namespace lockstep
