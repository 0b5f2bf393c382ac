#include "lockstep/events/log_processor.h"

#include <algorithm>

#include "lockstep/core/error.h"

namespace lockstep {

LogProcessor::LogProcessor(bool main_rank_values, size_t window, std::optional<std::regex> mean_pattern,
                           std::vector<CustomStatistic> custom)
    : main_rank_values_(main_rank_values),
      window_(window),
      mean_pattern_(std::move(mean_pattern)),
      custom_(std::move(custom)) {
  LOCKSTEP_CHECK(window_ >= 1, "the log window must be at least 1, got ", window_);
}

LogProcessor LogProcessor::mmengine(size_t window_size, const std::string& mean_pattern,
                                    std::vector<CustomStatistic> custom) {
  std::regex pattern;
  try {
    pattern = std::regex(mean_pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& error) {
    LOCKSTEP_FAIL("mean_pattern '", mean_pattern, "' is not a regular expression: ", error.what());
  }
  for (const auto& statistic : custom) {
    LOCKSTEP_CHECK(!statistic.data_src.empty(), "a custom_cfg entry needs a data_src");
    LOCKSTEP_CHECK(!statistic.window_size || *statistic.window_size >= 1, "custom_cfg's ", statistic.data_src,
                   ": window_size must be at least 1");
  }
  return LogProcessor(/*main_rank_values=*/true, window_size, std::move(pattern), std::move(custom));
}

LogProcessor LogProcessor::detectron2(size_t window) {
  return LogProcessor(/*main_rank_values=*/false, window, std::nullopt, {});
}

std::optional<LogProcessor::Method> LogProcessor::method_named(const std::string& name) {
  if (name == "mean") return Method::kMean;
  if (name == "max") return Method::kMax;
  if (name == "min") return Method::kMin;
  if (name == "current") return Method::kCurrent;
  return std::nullopt;
}

namespace {
double statistic_of(LogProcessor::Method method, const HistoryBuffer& history, size_t window) {
  switch (method) {
    case LogProcessor::Method::kMean: return history.avg(window);
    case LogProcessor::Method::kMedian: return history.median(window);
    case LogProcessor::Method::kMin: return history.min(window);
    case LogProcessor::Method::kMax: return history.max(window);
    case LogProcessor::Method::kCurrent: return history.latest();
  }
  LOCKSTEP_FAIL("unknown statistic");
}
}  // namespace

double LogProcessor::value_of(const std::string& name, const HistoryBuffer& history, bool smoothing_hint) const {
  if (mean_pattern_) {
    // mmengine: re.search, so the pattern may match anywhere in the name.
    const bool mean = std::regex_search(name, *mean_pattern_);
    return statistic_of(mean ? Method::kMean : Method::kCurrent, history, window_);
  }
  return statistic_of(smoothing_hint ? Method::kMedian : Method::kCurrent, history, window_);
}

std::map<std::string, ScalarEvent> LogProcessor::summarize(const EventStorage& storage) const {
  std::map<std::string, ScalarEvent> values = storage.latest_with(
      [this](const std::string& name, const HistoryBuffer& history, bool hint) { return value_of(name, history, hint); });
  if (mean_pattern_) {
    // mmengine logs every training scalar at each logging iteration, also one
    // with no new entry since (grad_norm while gradients accumulate): the
    // step metrics' line is that of the latest one recorded.
    int64_t line = -1;
    for (const auto& [name, event] : values) {
      if (storage.smoothing_hint(name)) line = std::max(line, event.iteration);
    }
    for (auto& [name, event] : values) {
      if (storage.smoothing_hint(name)) event.iteration = line;
    }
  }
  if (custom_.empty()) return values;
  // custom_cfg: statistics of the raw histories, under their own names (or
  // in place of the default one, where log_name is data_src).
  for (const auto& statistic : custom_) {
    if (!storage.has(statistic.data_src)) continue;
    const HistoryBuffer history = storage.history(statistic.data_src);
    const size_t window = statistic.window_size.value_or(history.size());
    values[statistic.log_name.empty() ? statistic.data_src : statistic.log_name] =
        ScalarEvent{statistic_of(statistic.method, history, window), history.values().back().second};
  }
  return values;
}

}  // namespace lockstep
