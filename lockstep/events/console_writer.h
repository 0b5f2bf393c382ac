// ConsoleWriter: detectron2's CommonMetricPrinter for a terminal or a log.
//
// Prints iteration, ETA, smoothed losses, time, data_time, lr and peak memory
// through the logger:
//   eta: 0:01:23  iter: 200/2811  loss: 0.4123  loss_cls: 0.4123  time: 0.0310  data_time: 0.0002  lr: 0.0994
// On a terminal the lines print above the progress bar
// (hooks/progress_bar_hook.h), which is what redraws in place.
//
//   auto console = std::make_shared<lockstep::ConsoleWriter>(/*window=*/20);
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "lockstep/events/log_processor.h"
#include "lockstep/events/event_writer.h"

namespace lockstep {

// "1 day, 2:03:04" / "0:01:23"
std::string format_duration(double seconds);

class ConsoleWriter : public EventWriter {
 public:
  // Losses, grad_norm, time and data_time as `processor` logs them.
  explicit ConsoleWriter(LogProcessor processor);
  // detectron2's CommonMetricPrinter: losses and grad_norm as their median,
  // time and data_time as their mean, over `window`.
  explicit ConsoleWriter(size_t window = 20);
  void write(EventStorage& storage, int64_t max_iter) override;
  // The line write() would print (tests, custom writers).
  std::string format_line(EventStorage& storage, int64_t max_iter);

 private:
  std::optional<double> eta_seconds(EventStorage& storage, int64_t iteration, int64_t max_iter);
  LogProcessor processor_;
  // Fallback ETA when "time" is not recorded: wall clock between writes.
  std::optional<std::pair<int64_t, std::chrono::steady_clock::time_point>> last_write_;
};

}  // namespace lockstep
