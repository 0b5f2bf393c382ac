// Captures what lockstep's logger writes while it lives, for tests that
// check a warning or an error line.
//
//   lockstep::testing::LogCapture log;
//   wrapper.initialize_count_status(6, 20);
//   EXPECT_NE(log.text().find("inside an accumulation window"), std::string::npos);
//
// Header-only, so that any test binary can use it without build changes.
#pragma once

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>

#include <c10/macros/Macros.h>

#include "lockstep/core/logging.h"

namespace lockstep::testing {

class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    sink_->set_pattern("%l %v");
    logger().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  C10_DISABLE_COPY_AND_ASSIGN(LogCapture);

  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace lockstep::testing
