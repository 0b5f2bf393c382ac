#include "lockstep/runner/log_processor_config.h"

#include <set>

#include "lockstep/config/key_usage.h"
#include "lockstep/core/error.h"

namespace lockstep {

namespace {

size_t positive_window(const Config& section, const std::string& key, int64_t fallback) {
  const auto window = section.get<int64_t>(key, fallback);
  LOCKSTEP_CHECK(window >= 1, section.where(key), ": ", key, " must be at least 1, got ", window);
  return static_cast<size_t>(window);
}

// One custom_cfg entry: mmengine's data_src, log_name, method_name, window_size.
LogProcessor::CustomStatistic parse_custom_statistic(const Config& entry) {
  LOCKSTEP_CHECK(entry.is_map(), entry.where(), ": a custom_cfg entry is a map: {data_src: loss, method_name: max}");
  LogProcessor::CustomStatistic statistic;
  statistic.data_src = entry.get<std::string>("data_src");
  statistic.log_name = entry.get<std::string>("log_name", statistic.data_src);
  const auto method = entry.get<std::string>("method_name", "mean");
  const auto known = LogProcessor::method_named(method);
  LOCKSTEP_CHECK(known.has_value(), entry.where("method_name"), ": method_name '", method,
                 "' is none of mean, max, min, current");
  statistic.method = *known;
  if (entry.has("window_size")) {
    const Config window = entry.at("window_size");
    const std::string text = window.is_scalar() ? window.text() : "";
    if (text == "global") {
      statistic.window_size = std::nullopt;
    } else {
      LOCKSTEP_CHECK(text != "epoch", entry.where("window_size"),
                     ": window_size: epoch counts the iterations of the current epoch, which lockstep's log "
                     "processor does not follow; give a number of entries or global");
      statistic.window_size = positive_window(entry, "window_size", 1);
    }
  } else {
    statistic.window_size = std::nullopt;  // mmengine: the whole history
  }
  check_all_used(entry, "custom_cfg entry");
  return statistic;
}

}  // namespace

LogProcessor parse_log_processor(const Config& section) {
  if (section.is_null()) return LogProcessor::mmengine();
  LOCKSTEP_CHECK(section.is_map(), section.where(), ": log_processor is a map: {window_size: 10}");
  const auto type = section.get<std::string>("type", "LogProcessor");
  if (type == "Detectron2LogProcessor") {
    const size_t window = positive_window(section, "window_size", 20);
    check_all_used(section, "log_processor 'Detectron2LogProcessor'");
    return LogProcessor::detectron2(window);
  }
  LOCKSTEP_CHECK(type == "LogProcessor", section.where("type"), ": log_processor type '", type,
                 "' is neither LogProcessor (mmengine's) nor Detectron2LogProcessor");
  const size_t window = positive_window(section, "window_size", 10);
  const auto pattern = section.get<std::string>("mean_pattern", kMmengineMeanPattern);
  // Read so that mmengine's configs load: they shape only mmengine's own text line.
  section.get<bool>("by_epoch", true);
  section.get<int64_t>("num_digits", 4);
  LOCKSTEP_CHECK(!section.get<bool>("log_with_hierarchy", false), section.where("log_with_hierarchy"),
                 ": log_with_hierarchy (train/ and val/ prefixes in the logged names) is not supported");
  std::vector<LogProcessor::CustomStatistic> custom;
  std::set<std::string> names;
  const Config entries = section.child("custom_cfg");
  LOCKSTEP_CHECK(entries.is_null() || entries.is_sequence(), entries.where(),
                 ": custom_cfg is a list: [{data_src: loss, method_name: max}]");
  for (size_t i = 0; i < entries.size(); ++i) {
    custom.push_back(parse_custom_statistic(entries.at(i)));
    LOCKSTEP_CHECK(names.insert(custom.back().log_name).second, entries.at(i).where(), ": custom_cfg logs '",
                   custom.back().log_name, "' twice; give each entry its own log_name");
  }
  check_all_used(section, "log_processor 'LogProcessor'");
  try {
    return LogProcessor::mmengine(window, pattern, std::move(custom));
  } catch (const Error& error) {
    LOCKSTEP_FAIL(section.where("mean_pattern"), ": ", error.what());
  }
}

}  // namespace lockstep
