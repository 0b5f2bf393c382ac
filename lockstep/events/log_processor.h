// LogProcessor: the number a run logs for each scalar, read from its history
// in the EventStorage, and whose values those are.
//
// Two libraries, two answers, both kept exactly:
//   - mmengine's LogProcessor (the default of `lockstep train`, config key
//     `log_processor`): every scalar holds rank 0's own values; names that
//     match `mean_pattern` (loss, time, data_time, grad_norm) are logged as
//     the mean of their last `window_size` entries, the rest as their latest
//     value; `custom_cfg` adds statistics under names of their own.
//   - detectron2's writers (the default of a Trainer built in C++): every
//     scalar holds the mean over ranks (data_time the slowest rank's), and
//     scalars put with a smoothing hint are logged as the median of their
//     last `window` values.
// Means are summed as numpy sums (Note [numpy's pairwise sum]), so a logged
// mean is the bits mmengine writes to scalars.json.
//
//   auto processor = lockstep::LogProcessor::mmengine(/*window_size=*/10);
//   for (const auto& [name, event] : processor.summarize(storage)) { ... }
//   lockstep::TrainerOptions().log_processor(processor);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "lockstep/events/event_storage.h"

namespace lockstep {

// mmengine's LogProcessor.mean_pattern default.
inline constexpr const char* kMmengineMeanPattern = ".*(loss|time|data_time|grad_norm).*";

class LogProcessor {
 public:
  enum class Method { kMean, kMedian, kMin, kMax, kCurrent };

  // One entry of mmengine's custom_cfg: `method` of `data_src`'s last
  // `window_size` entries (nullopt: every entry, mmengine's 'global'),
  // logged as `log_name`.
  struct CustomStatistic {
    std::string data_src;
    std::string log_name;
    Method method = Method::kMean;
    std::optional<size_t> window_size;
  };

  static LogProcessor mmengine(size_t window_size = 10, const std::string& mean_pattern = kMmengineMeanPattern,
                               std::vector<CustomStatistic> custom = {});
  static LogProcessor detectron2(size_t window = 20);

  // Method by mmengine's name ("mean", "max", "min", "current"); nullopt if none.
  static std::optional<Method> method_named(const std::string& name);

  // The value logged now for every scalar in `storage`, custom statistics
  // included, each with the iteration of its latest entry.
  std::map<std::string, ScalarEvent> summarize(const EventStorage& storage) const;
  // The value logged now for one scalar.
  double value_of(const std::string& name, const HistoryBuffer& history, bool smoothing_hint) const;

  // Whether each rank's metrics are rank 0's own (mmengine) or the mean over
  // ranks (detectron2).
  bool logs_main_rank_values() const { return main_rank_values_; }
  // The smoothing window (window_size, or detectron2's window).
  size_t window() const { return window_; }

 private:
  LogProcessor(bool main_rank_values, size_t window, std::optional<std::regex> mean_pattern,
               std::vector<CustomStatistic> custom);

  bool main_rank_values_;
  size_t window_;
  std::optional<std::regex> mean_pattern_;  // mmengine's; detectron2 smooths by hint
  std::vector<CustomStatistic> custom_;
};

}  // namespace lockstep
