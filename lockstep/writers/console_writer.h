// ConsoleWriter: detectron2's CommonMetricPrinter for a terminal or a log.
//
// Prints iteration, ETA, smoothed losses, time, data_time, lr and peak memory:
//   eta: 0:01:23  iter: 200/2811  loss: 0.4123  loss_cls: 0.4123  time: 0.0310  data_time: 0.0002  lr: 0.0994
// On a terminal (isatty) it redraws one live progress line instead of
// scrolling; elsewhere (CI logs, files) it prints plain lines through the logger.
//
//   auto console = std::make_shared<lockstep::ConsoleWriter>(/*window=*/20);
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "lockstep/writers/event_writer.h"

namespace lockstep {

// "1 day, 2:03:04" / "0:01:23"
std::string format_duration(double seconds);

class ConsoleWriter : public EventWriter {
 public:
  // `live`: nullopt decides by isatty(stderr).
  explicit ConsoleWriter(size_t window = 20, std::optional<bool> live = std::nullopt);
  void write(EventStorage& storage, int64_t max_iter) override;
  void close() override;
  // The line write() would print (tests, custom writers).
  std::string format_line(EventStorage& storage, int64_t max_iter);

 private:
  std::optional<double> eta_seconds(EventStorage& storage, int64_t iteration, int64_t max_iter);
  size_t window_;
  bool live_;
  bool line_open_ = false;
  // Fallback ETA when "time" is not recorded: wall clock between writes.
  std::optional<std::pair<int64_t, std::chrono::steady_clock::time_point>> last_write_;
};

}  // namespace lockstep
